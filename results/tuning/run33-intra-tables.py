"""Run 33 (H200): chunk_intra with per-sub-chunk factor tables (two exp2 per element instead of
eight) and the value checks of g and beta inside the kernel, against the run-30 kernel.

Times in one process on the same inputs: the previous chunk_intra (git show 2fb69cc:kda/kernels/
level5.py, saved as .scratch/level5_old.py), the new one, knock-out variants of the new one
(timing only: a stage removed from its source text, results wrong), level 3's form (delta=False),
and kda.chunk_kda against fla's chunk_kda at the issue's three shapes. One JSON line per
measurement to $OUT/run33.jsonl as it goes.

    python results/tuning/run33-intra-tables.py compile time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile, variant_module  # noqa: E402

RUN = "run33"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]
CFG = dict(threads=256, min_blocks=2)
# knock-outs: (name, text in kda/kernels/level5.py, replacement)
KNOCKOUTS = [
    ("no_solve", "            invert_diagonal_blocks(A_s, Tinv_s, C, BC)\n            merge_by_substitution(A_s, Tinv_s, C, BC)\n", ""),
    ("no_cumsum", "        log2_cumsum_by_columns(g_s, G_s, L, C, DK, flags)\n\n", "\n"),
    ("no_offdiag", "        for I in T.unroll(1, NS):", "        for I in T.unroll(1, 1):"),
    ("no_wu_gemms", "            T.gemm(Tb_s, K_s, W_f, clear_accum=True)\n            T.gemm(Tb_s, V_s, U_f, clear_accum=True)\n", ""),
]


def module(name):
    """kda.kernels.level5 (new), the saved old one, or a knock-out variant, as a fresh module."""
    if name == "old":
        return variant_module(name, ".scratch/level5_old.py")
    return variant_module(name, replacements=[(a, b) for ko, a, b in KNOCKOUTS if ko == name])


def kernels():
    out = [("old", dict(DK=128, DV=128, dtype="bfloat16", **CFG)), ("new", dict(DK=128, DV=128, dtype="bfloat16", **CFG)),
           ("new", dict(DK=128, DV=128, dtype="bfloat16", delta=False, **CFG))]
    out += [(ko, dict(DK=128, DV=128, dtype="bfloat16", **CFG)) for ko, _, _ in KNOCKOUTS]
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
                args = (q, k, v, g, beta, scale, *outs) if delta else (q, k, g, scale, *outs[:4])
                args = args if name == "old" else (*args, flags)
                log(RUN, {**row, "what": f"chunk_intra {name}" + ("" if delta else " delta=False"),
                          "ms": median_ms(lambda: kern(*args))})
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
