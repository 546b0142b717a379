# snippet: cpu
"""The article's sequence-in-grid kernel as written, compiled for sm_90a with tilelang 0.1.15:
two pipeline stages fail, one compiles; with the block's own chunk in its own buffers, two do."""
import tilelang

from kda.kernels.chapters import linear_attention
from kda.kernels.build import SM90A, compile_program
from kda.site.runtime import text

tilelang.set_log_level("WARNING")   # its INFO lines go to stdout, which is this page's output

cases = [(text(zh="原文写法，num_stages=2", en="as written, num_stages=2"),
          dict(own_chunk_buffers=False, num_stages=2)),
         (text(zh="原文写法，num_stages=1", en="as written, num_stages=1"),
          dict(own_chunk_buffers=False, num_stages=1)),
         (text(zh="本块单独的 buffer，num_stages=2", en="own chunk buffers, num_stages=2"),
          dict(own_chunk_buffers=True, num_stages=2))]
print("| kernel | " + text(zh="结果", en="result") + " |\n|---|---|")
for name, options in cases:
    try:
        compile_program(linear_attention.seq_in_grid, (), target=SM90A, DK=64, DV=64, dtype="float16", **options)
        result = text(zh="编译通过", en="compiles")
    except Exception as e:   # tilelang raises its own InternalError type
        result = "`" + str(e).strip().splitlines()[-1].strip() + "`"
    print(f"| {name} | {result} |")
