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

The replacements apply to ``kda/kernels/level5.py`` as of commit 327a1ea, before the middle form was
adopted (a124d42).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import replaced, run_intra_variants  # noqa: E402

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


if __name__ == "__main__":
    run_intra_variants(RUN, list(VARIANTS), replaced(VARIANTS), sys.argv)
