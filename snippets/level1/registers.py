# snippet: cpu
"""Registers, stack and spills of the level-1 kernels, from ptxas -v for sm_90a (bf16); and, for
the warp-specialised consumer, the smallest register budget that compiles without spills."""
import tilelang

from kda.kernels.chapters import linear_attention
from kda.kernels.build import SM90A, compile_program
from kda.kernels.registers import report
from kda.site.runtime import text
from kda.tables import Table

tilelang.set_log_level("WARNING")   # its INFO lines go to stdout, which is this page's output

table = Table(["kernel", "DK x DV", text(zh="ptxas 寄存器数", en="ptxas registers"),
               text(zh="溢出写入", en="spill stores"), text(zh="溢出读取", en="spill loads"),
               text(zh="消费者：不溢出的最小预算", en="consumer: smallest budget without spills")])
for name, fn, params in [("seq_in_grid", linear_attention.seq_in_grid, {}),
                         ("seq_in_loop (block_dv 32)", linear_attention.seq_in_loop, {"block_dv": 32})]:
    for dk, dv in [(64, 64), (128, 128)]:
        kernel = compile_program(fn, (), target=SM90A, DK=dk, DV=dv, dtype="bfloat16", **params)
        r = report(kernel)
        table.rows.append([name, f"{dk} x {dv}", r["registers"], r["spill_store_bytes"], r["spill_load_bytes"],
                           r["smallest_without_spills"]])
print(table)
