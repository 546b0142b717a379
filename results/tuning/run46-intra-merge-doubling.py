"""Run 46 (H200, planned): the solve's merge by doubling.

Run 45 (Nsight Compute, the kernel after runs 42-43) put level 4's block substitution, the merge
of the 16 x 16 diagonal inverses into ``T = (I + A_kk)^-1``, at 16% of ``chunk_intra``'s warp
samples: twelve phases, each behind a block barrier (run 44: four partial sums per dot product
changed nothing, so the phases' latency is the cost, not the multiply-add chains). Doubling pairs
blocks of ``b`` rows into blocks of ``2b``, ``T_10 = -T_11 A_10 T_00``: two levels (16 -> 32 -> 64),
each two products, four phases in all, the same number of multiply-adds.

Variants (source replacements in ``kda/kernels/level5.py``): ``of record`` and ``merge by doubling``.
Check and time as run 43.

    python results/tuning/run46-intra-merge-doubling.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import replaced, run_intra_variants  # noqa: E402

RUN = "run46"

MERGE_BY_DOUBLING = [
    ("from kda.kernels.level4 import merge_by_substitution\n", '''

@T.macro
def merge_pairs(A_s, Tinv_s, X_s, C, b):
    for p, r, c in T.Parallel(C // (2 * b), b, b):                # X = A_10 T_00 of pair p
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(b):
            acc += A_s[p * 2 * b + b + r, p * 2 * b + m] * Tinv_s[p * 2 * b + m, p * 2 * b + c]
        X_s[(p * b + r) * b + c] = acc
    for p, r, c in T.Parallel(C // (2 * b), b, b):                # T_10 = -T_11 X
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(b):
            acc += Tinv_s[p * 2 * b + b + r, p * 2 * b + b + m] * X_s[(p * b + m) * b + c]
        Tinv_s[p * 2 * b + b + r, p * 2 * b + c] = -acc


@T.macro
def merge_by_doubling(A_s, Tinv_s, C, block):
    X_s = T.alloc_shared([C * C // 4], ACCUM)
    merge_pairs(A_s, Tinv_s, X_s, C, block)             # 16 -> 32 (C = 64, block = 16)
    merge_pairs(A_s, Tinv_s, X_s, C, 2 * block)         # 32 -> 64
'''),
    ("            merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)", "            merge_by_doubling(A_s, Tinv_s, C, SOLVE_BLOCK)"),
]
VARIANTS = {"of record": [], "merge by doubling": MERGE_BY_DOUBLING}


if __name__ == "__main__":
    run_intra_variants(RUN, list(VARIANTS), replaced(VARIANTS), sys.argv)
