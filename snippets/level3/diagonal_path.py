# snippet: cpu
"""How often the per-channel kernel's diagonal sub-chunks take the slow pairwise path: a chunk
does when, in some sub-chunk, a channel's gate falls by more than the kernel's bound (log2 units)
from the row before the sub-chunk to its last row. Gates drawn as models draw them, x ~ N(0, 1),
T = 8192, H = 8, D = 128; the kernel's 16-row sub-chunks beside 32-row ones (one GEMM fewer
per chunk, and the reason the kernel keeps 16)."""
from kda.kernels.level3 import DIAGONAL_SPAN_MAX
from kda.kernels.level5 import SUBCHUNK
from kda.tables import level3

print(f"bound: {DIAGONAL_SPAN_MAX:g} in log2 units, a fall of e^-{DIAGONAL_SPAN_MAX * 0.6931:.1f} "
      f"over the sub-chunk\n")
for rows in (SUBCHUNK, 2 * SUBCHUNK):
    print(f"{rows}-row sub-chunks{' (the kernel)' if rows == SUBCHUNK else ''}:\n")
    print(level3.diagonal_path_share(DIAGONAL_SPAN_MAX, subchunk=rows))
    print()
