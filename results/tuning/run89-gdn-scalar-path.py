"""Run 89 (H200): GDN by ``kda.kernels.scalar_gate`` (the gated inverse, then a pass that forms
``K S`` and ``Q K^T`` itself) against level 5's GDN path, fla's Triton path and FlashQLA, over shapes
from few to many (head, sequence) pairs, to set where ``kda.gated_delta`` takes the new path
(``SCALAR_GATE_MIN_BLOCKS``) and its columns per block.

* ``compile``: the new path's kernels at DK = DV = 128, bf16, in parallel processes;
* ``time``: per shape, each path's whole op (``check_values=False`` and checked), the two kernels of
  the new path alone, fla (``FLA_FLASH_QLA=0``) and FlashQLA 0.1.3; every output against level 5's
  (rel L2) and the new path's against fla's.

* ``packed``: 96 random lengths and 1024 short sequences, both paths, packed and as one sequence;
* ``split``: the intra-card split by the scalar-gate path against level 5's and FlashQLA's.

    FLA_FLASH_QLA=0 python results/tuning/run89-gdn-scalar-path.py compile time packed
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import compile_in_processes, log  # noqa: E402

RUN = "run89"
# (B, T, H, HV, D): H query/key heads, HV value heads; the two shapes first, then more pairs
SHAPES = [(1, 32768, 32, 32, 128), (1, 8192, 96, 96, 128), (1, 16384, 64, 64, 128), (2, 8192, 48, 48, 128),
          (4, 4096, 64, 64, 128), (8, 4096, 32, 32, 128), (1, 32768, 16, 32, 128), (4, 8192, 16, 32, 128)]
VARIANTS = [("inverse", {}), ("pass", dict(block_dv=128)), ("pass", dict(block_dv=64)),
            ("pass", dict(block_dv=128, value_groups=2)), ("inverse", dict(value_groups=2)),
            ("pass", dict(block_dv=64, value_groups=2)), ("inverse", dict(varlen=True)),
            ("pass", dict(block_dv=128, varlen=True)), ("pass", dict(block_dv=64, varlen=True))]


def compile_one(i):
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    kind, extra = VARIANTS[i]
    t = time.time()
    if kind == "inverse":
        compile_program(scalar_gate.chunk_gated_inverse, (), DK=128, dtype="bfloat16", **extra)
    else:
        compile_program(scalar_gate.inverse_state_output_pass, (), DK=128, DV=128, dtype="bfloat16", **extra)
    return {"what": "compile", "kind": kind, **extra, "s": round(time.time() - t, 1)}


def time_shapes():
    import torch
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4

    assert os.environ.get("FLA_FLASH_QLA") == "0"
    for B, T, H, HV, D in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
        k = ref4.l2_normalize(torch.randn(B, T, H, D, generator=gen, device="cuda")).bfloat16()
        v = torch.randn(B, T, HV, D, generator=gen, device="cuda").bfloat16()
        beta = torch.rand(B, T, HV, generator=gen, device="cuda").bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen, device="cuda"))
        scale = D ** -0.5
        shape = {"B": B, "T": T, "H": H, "HV": HV, "D": D}

        def kda_gdn(path, columns=128, check=False):
            def run():
                gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_COLUMNS = path, columns
                gated_delta.SCALAR_GATE_MIN_BLOCKS = 0.0
                return gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, check_values=check)[0]
            return run

        fns = {"level5 path": kda_gdn(False), "level5 path, checked": kda_gdn(False, check=True),
               "scalar path 128": kda_gdn(True, 128), "scalar path 128, checked": kda_gdn(True, 128, True),
               "scalar path 64": kda_gdn(True, 64)}
        ref = fns["level5 path"]().double()
        outputs = {}
        for name, fn in fns.items():
            fn()                                    # sets the switch for this row, compiles, warms
            outputs[name] = fn()
            log(RUN, {"what": "time", **shape, "impl": name, "ms": round(median_ms(fn), 4),
                      "rel_l2_vs_level5": rel_l2(outputs[name], ref)})
        # the new path's two kernels alone (128 columns)
        C, groups = 64, HV // H
        inverse = compile_program(scalar_gate.chunk_gated_inverse, (), DK=D, dtype="bfloat16", value_groups=groups)
        G = torch.empty(B, HV, -(-T // C) * C, device="cuda")
        Tb = torch.empty(B, T, HV, C, dtype=torch.bfloat16, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        gf, bf = g.contiguous(), beta.float().contiguous()
        no_table = torch.empty(1, 1, dtype=torch.int32, device="cuda")
        log(RUN, {"what": "stage", **shape, "stage": "chunk_gated_inverse",
                  "ms": round(median_ms(lambda: inverse(k, gf, bf, G, Tb, flags, no_table)), 4)})
        for cols in (128, 64):
            state_pass = compile_program(scalar_gate.inverse_state_output_pass, (), DK=D, DV=D, block_dv=cols,
                                         dtype="bfloat16", value_groups=groups)
            o = torch.empty_like(v)
            none = torch.empty(1, 1, 1, 1, device="cuda")
            stand_in = torch.empty(1, dtype=torch.int32, device="cuda")
            log(RUN, {"what": "stage", **shape, "stage": f"inverse_state_output_pass {cols}",
                      "ms": round(median_ms(lambda: state_pass(q, k, v, Tb, G, scale, none, o, none, stand_in,
                                                               stand_in, stand_in)), 4)})
        peers = {"fla Triton": lambda: fla_gdn(q, k, v, g, beta, scale=scale)[0],
                 "FlashQLA": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0]}
        for name, fn in peers.items():
            try:
                out = fn()
                log(RUN, {"what": "time", **shape, "impl": name, "ms": round(median_ms(fn), 4),
                          "rel_l2_vs_level5": rel_l2(out, ref),
                          "rel_l2_vs_scalar": rel_l2(outputs["scalar path 128"], out.double())})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"what": "time", **shape, "impl": name, "error": repr(e)[-300:]})
        del q, k, v, g, beta, outputs, ref
        torch.cuda.empty_cache()


def time_packed():
    """Packed sequences: 96 random lengths and 1024 sequences of 1 to 64 tokens (H = 32 and 96), both
    paths, against the same tokens as one sequence."""
    import torch

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4

    gen = torch.Generator().manual_seed(3)
    split = torch.distributions.Dirichlet(torch.ones(96)).sample()
    short = torch.randint(1, 65, (1024,), generator=gen)
    for H in (32, 96):
        tokens = 32768 if H == 32 else 8192          # the two shapes
        cases = {"96 random lengths": (split * tokens).round().clamp(min=1).long(), "1024 of 1-64 tokens": short}
        for name, lengths in cases.items():
            T = int(lengths.sum())
            cu = torch.tensor([0, *lengths.cumsum(0).tolist()], device="cuda", dtype=torch.int32)
            g_ = torch.Generator(device="cuda").manual_seed(5)
            q = torch.randn(1, T, H, 128, generator=g_, device="cuda").bfloat16()
            k = ref4.l2_normalize(torch.randn(1, T, H, 128, generator=g_, device="cuda")).bfloat16()
            v = torch.randn(1, T, H, 128, generator=g_, device="cuda").bfloat16()
            beta = torch.rand(1, T, H, generator=g_, device="cuda")
            g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, generator=g_, device="cuda"))
            cpu = cu.cpu()
            outs = {}
            for path in (False, True):
                gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_MIN_BLOCKS = path, 0.0
                gated_delta.SCALAR_GATE_PACKED = path
                for packed in (True, False):
                    fn = (lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                                                     cu_seqlens_cpu=cpu)[0]) if packed else \
                        (lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta)[0])
                    out = fn()
                    key = ("scalar" if path else "level5", packed)
                    outs[key] = out
                    log(RUN, {"what": "packed", "case": name, "H": H, "T": T, "N": len(lengths),
                              "path": key[0], "packed": packed, "ms": round(median_ms(fn), 4),
                              "rel_l2_vs_level5": rel_l2(out, outs.get(("level5", packed), out).double())})


def time_split():
    """Long context, few heads: GDN's split by the scalar-gate path (several run counts) against
    level 5's split (``choose_pieces``), FlashQLA (its automatic split) and fla, at (1, 131072, 4, 128),
    and the headline shape (1, 32768, 32, 128)."""
    import torch
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

    from kda import distributed, gated_delta
    from kda.bench import median_ms
    from kda.distributed import split_forward
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4

    for B, T, H, D in ((1, 131072, 4, 128), (1, 32768, 32, 128)):
        gen = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
        k = ref4.l2_normalize(torch.randn(B, T, H, D, generator=gen, device="cuda")).bfloat16()
        v = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
        beta = torch.rand(B, T, H, generator=gen, device="cuda")
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
        scale = D ** -0.5
        gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_MIN_BLOCKS = False, 0.5
        distributed.SCALAR_GATE_SPLIT = False
        ref = split_forward(q, k, v, g, beta)[0].double()
        rows = {"level5 split (auto)": lambda: split_forward(q, k, v, g, beta)[0]}
        for P in (1, 4, 8, 16, 32, 64):
            rows[f"scalar split {P}"] = (lambda P=P: split_forward(q, k, v, g, beta, P)[0])
        rows["scalar split (auto)"] = lambda: split_forward(q, k, v, g, beta)[0]
        rows["fla Triton"] = lambda: fla_gdn(q, k, v, g, beta, scale=scale)[0]
        rows["FlashQLA (auto_cp)"] = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0]
        for name, fn in rows.items():
            gated_delta.SCALAR_GATE_PATH = distributed.SCALAR_GATE_SPLIT = name.startswith("scalar")
            try:
                out = fn()
                log(RUN, {"what": "split", "B": B, "T": T, "H": H, "impl": name, "ms": round(median_ms(fn), 4),
                          "rel_l2_vs_level5_split": rel_l2(out, ref)})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"what": "split", "B": B, "T": T, "H": H, "impl": name, "error": repr(e)[-300:]})
        del q, k, v, g, beta, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    stages = {"compile": lambda: compile_in_processes(RUN, len(VARIANTS), compile_one), "time": time_shapes,
              "packed": time_packed, "split": time_split}
    for stage in sys.argv[1:]:                # in the order given
        stages[stage]()
