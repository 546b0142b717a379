"""Run 43 (H200, planned): ``chunk_intra``'s wide path as one GEMM about the chunk's middle.

Where a chunk's gate falls by at most ``DIAGONAL_SPAN_MAX`` (log2) over each 32-row half, the
wide path of record makes two GEMMs (below the diagonal, then the diagonal blocks) and merges
them in registers by row and column: in run 41's profile those merges were the most costly block
of the kernel (about 10% of the warp samples, integer index arithmetic and spills). Referring
every row and column to the gate at the middle row ``G_m`` instead, left ``[q; k] 2^(G - G_m)``
and right ``k 2^(G_m - G)``, no factor exceeds ``2^96`` under the same condition, and one GEMM
gives both score matrices at once; the entries above the diagonal (which may overflow) are masked
when A_qk and A_kk are written. Variants (source replacements in ``kda/kernels/level5.py``):

* ``of record``: the wide path as two GEMMs and merges;
* ``middle``: ``scores_about_middle``;
* ``middle, merge unrolled``: also level 4's block substitution with its distance loop unrolled
  in the IR (``T.unroll(..., explicit=True)``), so that tilelang's barriers are not repeated for
  each block pair.

check: every output against the first variant (rel. L2, NaN-poisoned outputs) at (1, 4096, 32,
128) and the ragged (2, 1000, 4, 128), bf16, logsigmoid and -2 softplus gates, and both the output
through the state pass against the float64 recurrence at the ragged shape; time: ``chunk_intra`` at
(1, 32768, 32, 128) under both gates, ``chunk_kda`` at the three benchmark shapes.

    python results/tuning/run43-intra-middle.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile, variant_module  # noqa: E402

RUN = "run43"
MIDDLE = [("                scores(Qw, Kw, scale, buffers, t0, bb, bh, wide)",
           "                scores_about_middle(Qw, Kw, scale, buffers, t0, bb, bh)")]
MERGE_UNROLLED = [("from kda.kernels.level4 import merge_by_substitution\n", '''

@T.macro
def merge_by_substitution(A_s, Tinv_s, C, block):
    n = C // block
    X_s = T.alloc_shared([n - 1, block, block], ACCUM)
    for d in T.unroll(1, n, explicit=True):
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block * d):
                acc += A_s[(p + d) * block + r, p * block + m] * Tinv_s[p * block + m, p * block + c]
            X_s[p, r, c] = acc
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block):
                acc += Tinv_s[(p + d) * block + r, (p + d) * block + m] * X_s[p, m, c]
            Tinv_s[(p + d) * block + r, p * block + c] = -acc
''')]
VARIANTS = {"of record": [], "middle": MIDDLE, "middle, merge unrolled": MIDDLE + MERGE_UNROLLED}
SHAPES = [(1, 8192, 96, 128), (4, 4096, 64, 128), (1, 32768, 32, 128)]


def module(name):
    return variant_module(name.replace(" ", "_").replace(",", ""), replacements=VARIANTS[name])


def compile_one(i):
    sys.path.insert(0, ROOT)
    name = list(VARIANTS)[i]
    return {"compile": name, **try_compile(lambda: module(name).chunk_intra, dict(DK=128, DV=128, dtype="bfloat16"))}


def gates(shape, kind):
    import torch
    x = torch.randn(*shape, device="cuda")
    return torch.nn.functional.logsigmoid(x) if kind == "logsigmoid" else -2 * torch.nn.functional.softplus(x)


def check():
    import torch

    from kda.gated_delta import ChunkForm
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    names = ["Qw", "Kw", "decay", "A_qk", "W", "U"]
    mods = {name: module(name) for name in VARIANTS}
    for B, T, H, D in [(1, 4096, 32, 128), (2, 1000, 4, 128)]:
        q, k, v, _, beta = kda_inputs(B, T, H, D)
        for kind in ("logsigmoid", "-2 softplus"):
            g = gates((B, T, H, D), kind)
            first = None
            for name, mod in mods.items():
                kern = compile_program(mod.chunk_intra, (), DK=D, DV=D, dtype="bfloat16")
                outs = intra_outputs(q, v)
                for o in outs:
                    o.fill_(float("nan"))
                flags = torch.zeros(2, dtype=torch.int32, device="cuda")
                kern(q, k, v, g, beta, D ** -0.5, *outs, flags)
                torch.cuda.synchronize()
                first = outs if first is None else first
                row = {"check": name, "shape": [B, T, H, D], "gate": kind, "flags": flags.tolist(),
                       "nan": any(bool(o.isnan().any()) for o in outs),
                       **{n: float(rel_l2(o.double(), r.double())) for n, o, r in zip(names, outs, first)}}
                if T == 1000:       # o through the state pass of record, against the float64 recurrence
                    from kda.gated_delta import run_state_pass
                    o, _ = run_state_pass(ChunkForm(outs[0], outs[1], outs[4], outs[5], outs[3], outs[2]), None)
                    h0 = torch.zeros(B, H, D, D, device="cuda")
                    o_ref, _ = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
                    row["o_vs_float64"] = float(rel_l2(o, o_ref))
                log(RUN, row)


def time_all():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms
    from kda.kernels import level5
    from kda.kernels.build import compile_program
    B, T, H, D = 1, 32768, 32, 128
    q, k, v, _, beta = kda_inputs(B, T, H, D)
    outs = intra_outputs(q, v)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    for kind in ("logsigmoid", "-2 softplus"):
        g = gates((B, T, H, D), kind)
        for name in VARIANTS:
            kern = compile_program(module(name).chunk_intra, (), DK=D, DV=D, dtype="bfloat16")
            log(RUN, {"what": "chunk_intra", "variant": name, "gate": kind,
                      "ms": median_ms(lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags))})
    del q, k, v, beta, outs, g
    adopted = level5.chunk_intra
    for shape in SHAPES:
        q, k, v, g, beta = kda_inputs(*shape)
        for name in VARIANTS:
            level5.chunk_intra = module(name).chunk_intra
            log(RUN, {"what": "chunk_kda", "variant": name, "shape": list(shape), "check_values": False,
                      "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=False))})
        level5.chunk_intra = adopted
        del q, k, v, g, beta
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS), compile_one)
    if "check" in sys.argv:
        check()
    if "time" in sys.argv:
        time_all()
