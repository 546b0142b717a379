# snippet: cpu
"""The article's sequence-in-grid kernel as written, compiled for sm_90a with tilelang 0.1.15:
two pipeline stages fail, one compiles; with the block's own chunk in its own buffers, two do."""
import tilelang

from kda.kernels import level1
from kda.kernels.build import SM90A, compile_program

tilelang.set_log_level("WARNING")   # its INFO lines go to stdout, which is this page's output

cases = [("as written, num_stages=2", dict(own_chunk_buffers=False, num_stages=2)),
         ("as written, num_stages=1", dict(own_chunk_buffers=False, num_stages=1)),
         ("own chunk buffers, num_stages=2", dict(own_chunk_buffers=True, num_stages=2))]
print("| kernel | result |\n|---|---|")
for name, options in cases:
    try:
        compile_program(level1.seq_in_grid, (), target=SM90A, DK=64, DV=64, dtype="float16", **options)
        result = "compiles"
    except Exception as e:   # tilelang raises its own InternalError type
        result = "`" + str(e).strip().splitlines()[-1].strip() + "`"
    print(f"| {name} | {result} |")
