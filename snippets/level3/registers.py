# snippet: cpu
"""Registers and spills of the level-3 kernels, compiled for sm_90a (DK = DV = 128, C = 64,
bf16 inputs, float32 gates). The per-channel pass is warp-specialised by tilelang (128 TMA
producers, 128 consumers); the scalar pass by hand (512 threads, no register limit)."""
import re

import tilelang

from kda.kernels.chunk_intra import chunk_intra
from kda.kernels.linear_pass import chunk_cumsum, seq_in_loop_scalar
from kda.kernels.per_channel_pass import seq_in_loop_per_channel
from kda.kernels.build import SM90A, compile_program
from kda.kernels.registers import report
from kda.site.runtime import text
from kda.tables import Table

tilelang.set_log_level("WARNING")   # its INFO lines go to stdout, which is this page's output


table = Table(["kernel", "grid", text(zh="线程数", en="threads"), text(zh="ptxas 寄存器数", en="ptxas registers"),
               text(zh="溢出写入（字节）", en="spill stores (bytes)"),
               text(zh="消费者：不溢出的最小预算", en="consumer: smallest budget without spills")])
for name, fn, params, grid in [
    ("chunk_cumsum", chunk_cumsum, dict(D=1), "(NC, H, B)"),
    ("seq_in_loop_scalar", seq_in_loop_scalar, dict(DK=128, DV=128), "(DV/32, H, B)"),
    ("chunk_intra(delta=False)", chunk_intra, dict(DK=128, delta=False), "(NC, H, B)"),
    ("seq_in_loop_per_channel", seq_in_loop_per_channel, dict(DK=128, DV=128), "(DV/32, H, B)"),
]:
    kernel = compile_program(fn, (), target=SM90A, **params)
    r = report(kernel)
    budget = r["smallest_without_spills"]
    threads = re.search(r"__launch_bounds__[(](\d+)", kernel.get_kernel_source()).group(1)
    table.rows.append([name, grid, threads, r["registers"], r["spill_store_bytes"],
                       budget if budget is not None else text(zh="未做 warp 特化", en="not warp-specialised")])
print(table)
