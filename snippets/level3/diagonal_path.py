# snippet: cpu
"""How often the per-channel kernel's diagonal sub-chunks take the slow pairwise path: a chunk
does when, in some sub-chunk, a channel's gate falls by more than the kernel's bound (log2 units)
from the row before the sub-chunk to its last row. Gates drawn as models draw them, x ~ N(0, 1),
T = 8192, H = 8, D = 128; for both sizes the kernel uses: 32-row sub-chunks (one GEMM below the
diagonal instead of three) in a chunk where they hold, 16-row ones where they do not."""
from kda.kernels.stages import DIAGONAL_SPAN_MAX
from kda.kernels.chunk_intra import SUBCHUNK, WIDE_SUBCHUNK
from kda.site.runtime import text
from kda.tables import level3

print(text(zh=f"界：以 2 为底 {DIAGONAL_SPAN_MAX:g}，即子块内衰减至 e^-{DIAGONAL_SPAN_MAX * 0.6931:.1f}\n",
           en=f"bound: {DIAGONAL_SPAN_MAX:g} in log2 units, a fall of e^-{DIAGONAL_SPAN_MAX * 0.6931:.1f} "
              f"over the sub-chunk\n"))
for rows in (SUBCHUNK, WIDE_SUBCHUNK):
    print(text(zh=f"{rows} 行子块：\n", en=f"{rows}-row sub-chunks:\n"))
    print(level3.diagonal_path_share(DIAGONAL_SPAN_MAX, subchunk=rows))
    print()
