"""Run 140 (prepared 2026-12-06): GDN's kernels without the block barriers that in-place shared-memory loops got.

Reading the CUDA source tilelang 0.1.15 writes for ``inverse_state_output_pass`` showed a barrier of the warpgroup in
every step of two loops of warpgroup 1, which is on the chain: ``X = V - 2^G K S`` written over ``V``'s slot (a loop
that reads and writes the same shared addresses) and ``V'``'s stores, 64 barriers a chunk. ``chunk_gated_inverse``'s
compact merge rounded ``A_21`` in place, eight a chunk. Now ``X`` and ``V'`` go through registers and one
``stmatrix`` copy each, and ``A_21`` is rounded into ``X``'s spent quadrant: no barrier in any step. The same sums in
the same order, so every output must equal the old kernels' bit for bit. The old kernels are rebuilt here from today's
source with the two edits undone (``in_place`` below), timed beside the new ones, kernel by kernel and in the op, and
beside FlashQLA (its default and ``auto_cp=False``) and fla's Triton GDN, dense at the two shapes of issue 15 and
packed (96 random lengths; 1024 sequences of 1 to 64 tokens). Rows to ``$OUT/run140.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run140-gdn.py --warm
"""
import importlib.util
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log, stage_times, time_stages  # noqa: E402

RUN = "run140"
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128)]
PACKED = ["96 random lengths", "1024 sequences of 1 to 64 tokens"]

# today's lines -> the old ones, per file: the two edits of this run undone
UNDO = {
    "kda/kernels/merge_by_halves.py": [("X, A21, T11, T22 = (A_s, 0, h), (A_s, 0, h)", "X, A21, T11, T22 = (A_s, 0, h), (A_s, h, 0)")],
    "kda/kernels/scalar_gate.py": [
        ("KS[i, jj] = v_s[slot, i, jj] - E_s[slot, i] * KS[i, jj]\n                    T.copy(KS, vn_s)\n",
         "v_s[slot, i, jj] = v_s[slot, i, jj] - E_s[slot, i] * KS[i, jj]\n"),
        ("T.gemm(tb_s[slot, :, :], vn_s, VD, clear_accum=True)", "T.gemm(tb_s[slot, :, :], v_s[slot, :, :], VD, clear_accum=True)"),
        ("KS[i, jj] = VD[i, jj] * R_s[slot, i]\n                    T.copy(KS, vn_s)\n", "vn_s[i, jj] = VD[i, jj] * R_s[slot, i]\n"),
        ("from kda.kernels.merge_by_halves import merge_by_halves", "from run140_merge_in_place import merge_by_halves"),
    ],
}


def in_place_module():
    """``kda.kernels.scalar_gate`` as it was before this run (written to files: tilelang reads a kernel's source)."""
    folder = tempfile.mkdtemp(prefix="run140-")
    names = {"kda/kernels/merge_by_halves.py": "run140_merge_in_place", "kda/kernels/scalar_gate.py": "run140_scalar_gate_in_place"}
    for path, edits in UNDO.items():
        text = open(os.path.join(ROOT, path)).read()
        for new, old in edits:
            assert text.count(new) == 1, (path, new)
            text = text.replace(new, old)
        with open(os.path.join(folder, names[path] + ".py"), "w") as f:
            f.write(text)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(names["kda/kernels/scalar_gate.py"],
                                                  os.path.join(folder, names["kda/kernels/scalar_gate.py"] + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use(variant):
    """Route the op's scalar-gate path through the ``variant``'s two factories (the launchers look them up by name)."""
    from kda.kernels import scalar_gate

    if not hasattr(use, "new"):
        use.new = scalar_gate.chunk_gated_inverse, scalar_gate.inverse_state_output_pass
    if variant == "barrier-free":
        scalar_gate.chunk_gated_inverse, scalar_gate.inverse_state_output_pass = use.new
    else:
        scalar_gate.chunk_gated_inverse = use.old.chunk_gated_inverse
        scalar_gate.inverse_state_output_pass = use.old.inverse_state_output_pass


def dense_inputs(B, T, H, D, seed=7):
    from kda.reference import level4 as ref4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, k, v = draw(B, T, H, D).bfloat16(), ref4.l2_normalize(draw(B, T, H, D)).bfloat16(), draw(B, T, H, D).bfloat16()
    return q, k, v, torch.nn.functional.logsigmoid(draw(B, T, H)), torch.rand(B, T, H, generator=gen, device="cuda")


def short_cases():
    """Runs 155, 157 and 158's short packed sequences: ``{case: lengths}``, run 140's 1024 of 1 to 64 tokens and
    8192 of 1 to 8."""
    gen = torch.Generator().manual_seed(144)
    return {"1024 sequences of 1 to 64 tokens": lengths("1024 sequences of 1 to 64 tokens"),
            "8192 sequences of 1 to 8 tokens": torch.randint(1, 9, (8192,), generator=gen).tolist()}


def lengths(case):
    gen = torch.Generator().manual_seed(96)
    if case == "96 random lengths":
        cuts = torch.randperm(32767, generator=gen)[:95].sort().values + 1
        return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([32768])])).tolist()
    return torch.randint(1, 65, (1024,), generator=gen).tolist()


def cases():
    for B, T, H, D in SHAPES:
        yield f"dense {B}x{T}x{H}x{D}", dense_inputs(B, T, H, D), None
    for case in PACKED:
        lens = lengths(case)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        yield case, dense_inputs(1, int(cu[-1]), 32, 128), cu


def warm_one(i):
    """Each variant's kernels compiled by one call of the op per case (a process of its own)."""
    from kda import gated_delta

    use.old = in_place_module()
    variant = ["barrier-free", "in place"][i]
    use(variant)
    for name, (q, k, v, g, beta), cu in cases():
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    torch.cuda.synchronize()
    return {"what": "warm", "variant": variant}


def compare(run, variants, use):
    """Every case timed through each of ``variants`` (``use(name)`` routes the op through one; the first is put back
    at the end), kernel by kernel, the outputs against the first variant's bit for bit, then the peers."""
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

    from kda import gated_delta
    from kda.bench import median_ms

    assert os.environ.get("FLA_FLASH_QLA") == "0"
    time_stages()
    for name, (q, k, v, g, beta), cu in cases():
        D = q.shape[-1]
        outs = {}
        for variant in variants:
            use(variant)
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
            outs[variant] = fn()
            log(run, {"case": name, "impl": f"kda {variant}", "ms": round(median_ms(fn), 4)})
            stage_times(run, {"case": name, "impl": f"kda {variant}", "what": "stages"}, fn)
        use(variants[0])
        first = outs[variants[0]]
        log(run, {"case": name, "same_bits": {n: [torch.equal(x, y) for x, y in zip(o, first)] for n, o in outs.items()},
                  "finite": {n: all(bool(torch.isfinite(x).all()) for x in o) for n, o in outs.items()}})
        peers = {"FlashQLA 0.1.3": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5,
                                                                             cu_seqlens=cu)[0],
                 "fla Triton": lambda: fla_gdn(q, k, v, g, beta, scale=D ** -0.5, cu_seqlens=cu)[0]}
        if cu is None:
            peers["FlashQLA auto_cp=False"] = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5,
                                                                                        auto_cp=False)[0]
        for impl, fn in peers.items():
            try:
                log(run, {"case": name, "impl": impl, "ms": round(median_ms(fn), 4)})
            except Exception as e:  # noqa: BLE001
                log(run, {"case": name, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        torch.cuda.empty_cache()


def main():
    use.old = in_place_module()
    compare(RUN, ["barrier-free", "in place"], use)


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, 2, warm_one)
    main()
