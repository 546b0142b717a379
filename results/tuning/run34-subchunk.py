"""Run 34 (H200): chunk_intra with 32-row score sub-chunks (one GEMM below the diagonal instead of
three) against 16-row ones, with knock-outs and without the register cap.

Times in one process on the same inputs: chunk_intra at both sub-chunk sizes, uncapped, knock-out
variants (timing only: a stage removed from its source text, results wrong), level 3's form
(delta=False), and kda.chunk_kda (32-row sub-chunks) against fla's chunk_kda at the three shapes.
One JSON line per measurement to $OUT/run34.jsonl as it goes.

    python results/tuning/run34-subchunk.py compile time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile, variant_module  # noqa: E402

RUN = "run34"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]
# knock-outs: (name, text in kda/kernels/level5.py, replacement)
KNOCKOUTS = [
    ("no_solve", "            invert_diagonal_blocks(A_s, Tinv_s, C, SOLVE_BLOCK)\n            merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)\n", ""),
    ("no_offdiag", "        for I in T.unroll(1, NS):", "        for I in T.unroll(1, 1):"),
]


def module(name):
    """kda.kernels.level5 or a knock-out variant of it, as a fresh module."""
    return variant_module(name, replacements=[(a, b) for ko, a, b in KNOCKOUTS if ko == name])


def kernels():
    base = dict(DK=128, DV=128, dtype="bfloat16")
    out = [("new", dict(base, subchunk=16)), ("new", dict(base, subchunk=32)),
           ("new", dict(base, subchunk=32, min_blocks=1)),
           ("new", dict(base, subchunk=16, delta=False)), ("new", dict(base, subchunk=32, delta=False))]
    out += [(ko, dict(base, subchunk=32)) for ko, _, _ in KNOCKOUTS]
    return out


def compile_one(i):
    sys.path.insert(0, ROOT)
    name, params = kernels()[i]
    return {"compile": name, "params": params, **try_compile(lambda: module(name).chunk_intra, params)}


def time_all():
    import torch
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import chunk_kda
    from kda.bench import median_ms
    from kda.kernels.build import compile_program

    for n, (B, T, H, D) in enumerate(SHAPES):
        scale = D ** -0.5
        q, k, v, g, beta = kda_inputs(B, T, H, D)
        row = {"B": B, "T": T, "H": H, "D": D}
        if n == 0:
            outs = intra_outputs(q, v)
            flags = torch.zeros(2, dtype=torch.int32, device="cuda")
            for name, params in kernels():
                kern = compile_program(module(name).chunk_intra, (), **params)
                delta = params.get("delta", True)
                args = (q, k, v, g, beta, scale, *outs, flags) if delta else (q, k, g, scale, *outs[:4], flags)
                log(RUN, {**row, "what": f"chunk_intra {name}", "params": params, "ms": median_ms(lambda: kern(*args))})
            assert flags.tolist() == [0, 0], flags
        ms_kda = median_ms(lambda: chunk_kda(q, k, v, g, beta, scale=scale))
        ms_fla = median_ms(lambda: fla_kda(q, k, v, g, beta, scale=scale))
        log(RUN, {**row, "what": "chunk_kda", "kda": ms_kda, "fla": ms_fla, "ratio": ms_fla / ms_kda})


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(kernels()), compile_one)
    if "time" in sys.argv:
        time_all()
