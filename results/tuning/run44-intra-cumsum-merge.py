"""Run 44 (H200, planned): two smaller stages of ``chunk_intra`` after run 43.

* ``cumsum by halves``: the gate's cumsum with two threads per channel (each sums one half of
  the chunk, then the second half adds the first half's total) instead of one thread per channel
  and 128 of the 256 threads idle; run 41 put the cumsum and the wait behind it at 7% of the samples.
* ``merge with 4 partial sums``: level 4's block substitution (the solve's merge, 11% of the
  samples in run 41) with each dot product split into four interleaved partial sums, so that its
  multiply-adds do not wait on one another.
* both.

Source replacements in ``kda/kernels/level5.py``; check and time as run 43 (``chunk_intra`` under
logsigmoid and -2 softplus gates at (1, 32768, 32, 128), ``chunk_kda`` at the three shapes).

    python results/tuning/run44-intra-cumsum-merge.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import replaced, run_intra_variants  # noqa: E402

RUN = "run44"

CUMSUM_BY_HALVES = [
    ("""    for d in T.Parallel(D):
        acc = T.alloc_var(ACCUM)
        bad = T.alloc_var(ACCUM)
        acc = 0.0
        bad = 0.0
        for i in T.serial(C):
            x = T.Cast(ACCUM, g_s[i, d])""",
     """    half_s = T.alloc_shared([2, D], ACCUM)
    for h, d in T.Parallel(2, D):
        acc = T.alloc_var(ACCUM)
        bad = T.alloc_var(ACCUM)
        acc = 0.0
        bad = 0.0
        for ii in T.serial(C // 2):
            i = h * (C // 2) + ii
            x = T.Cast(ACCUM, g_s[i, d])"""),
    ("""            G_s[i, d] = acc
        if bad > 0.0:
            flags[0] = 1
""", """            G_s[i, d] = acc
        half_s[h, d] = acc
        if bad > 0.0:
            flags[0] = 1
    for i, d in T.Parallel(C // 2, D):
        G_s[C // 2 + i, d] = G_s[C // 2 + i, d] + half_s[0, d]
"""),
]
MERGE_4_SUMS = [("from kda.kernels.level4 import merge_by_substitution\n", '''

@T.macro
def merge_by_substitution(A_s, Tinv_s, C, block):
    n = C // block
    X_s = T.alloc_shared([n - 1, block, block], ACCUM)
    for d in T.unroll(1, n):
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_local([4], ACCUM)
            for u in T.unroll(4):
                acc[u] = 0.0
            for m4 in T.serial(block * d // 4):
                for u in T.unroll(4):
                    m = m4 * 4 + u
                    acc[u] += A_s[(p + d) * block + r, p * block + m] * Tinv_s[p * block + m, p * block + c]
            X_s[p, r, c] = (acc[0] + acc[1]) + (acc[2] + acc[3])
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_local([4], ACCUM)
            for u in T.unroll(4):
                acc[u] = 0.0
            for m4 in T.serial(block // 4):
                for u in T.unroll(4):
                    m = m4 * 4 + u
                    acc[u] += Tinv_s[(p + d) * block + r, (p + d) * block + m] * X_s[p, m, c]
            Tinv_s[(p + d) * block + r, p * block + c] = -((acc[0] + acc[1]) + (acc[2] + acc[3]))
''')]
VARIANTS = {"of record": [], "cumsum by halves": CUMSUM_BY_HALVES, "merge with 4 partial sums": MERGE_4_SUMS,
            "both": CUMSUM_BY_HALVES + MERGE_4_SUMS}


if __name__ == "__main__":
    run_intra_variants(RUN, list(VARIANTS), replaced(VARIANTS), sys.argv)
