# snippet: cpu
"""The register budget of the level-2 kernel (DK = DV = 128, C = 64, 128 consumer threads, bf16):
the article's estimate (fp32 fragments S_f, acc_o, Gamma and A, divided over the threads) next
to what ptxas does with the compiled kernel for sm_90a."""
import tilelang

from kda.kernels.chapters import constant_decay
from kda.kernels.build import SM90A, compile_program
from kda.kernels.registers import report
from kda.site.runtime import text
from kda.tables import Table

tilelang.set_log_level("WARNING")   # its INFO lines go to stdout, which is this page's output

DK = DV = 128
C, THREADS = 64, 128
table = Table(["block_dv", text(zh="估算：S_f + acc_o + Gamma + A", en="estimate: S_f + acc_o + Gamma + A"),
               text(zh="ptxas 寄存器数", en="ptxas registers"),
               text(zh="溢出写入（字节）", en="spill stores (bytes)"),
               text(zh="消费者：不溢出的最小预算", en="consumer: smallest budget without spills")])
for block_dv in (32, 64, 128):
    estimate = (DK * block_dv + C * block_dv + 2 * C * C) // THREADS
    try:
        kernel = compile_program(constant_decay.seq_in_loop, (), target=SM90A, DK=DK, DV=DV, dtype="bfloat16",
                                 block_dv=block_dv)
        r = report(kernel)
        smallest = r["smallest_without_spills"]
        table.rows.append([block_dv, estimate, r["registers"], r["spill_store_bytes"],
                           smallest if smallest is not None
                           else text(zh="直到声明的预算也没有", en="none up to the declared budget")])
    except Exception as e:   # tilelang raises its own error types
        table.rows.append([block_dv, estimate, text(zh="编译不通过", en="does not compile"), "-",
                           str(e).strip().splitlines()[-1][:80]])
print(table)
