# snippet: cpu
"""What the backward of chunk_kda could keep in HBM from the forward, at the two shapes of the
speed goal (bf16 inputs, per-channel float32 gates, chunks of 64): bytes, and the time to write
them once and read them back once at 4.3 TB/s, against the bytes the backward must move anyway."""
from kda import ledger
from kda.chunking import CHUNK_SIZE as C
from kda.site.runtime import text
from kda.tables import Table

BF16, F32 = 2, 4
table = Table(["B, T, H, D", text(zh="从前向保留的内容", en="kept from the forward"),
               text(zh="形状", en="shape"), "MB",
               text(zh="写 + 读（ms）", en="write + read (ms)")],
              formats=[None, None, None, "{:,.0f}", "{:.3f}"])
for B, T, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
    NC, tokens = T // C, B * T * H
    items = [
        (text(zh="输入与 dO（q、k、v、dO 为 bf16；g、beta 为 float32）",
              en="inputs and dO (q, k, v, dO bf16; g, beta float32)"), "[B, T, H, *]",
         tokens * (4 * D * BF16 + (D + 1) * F32)),
        (text(zh="进入每个块的状态，float32", en="state entering each chunk, float32"), "[B, H, NC, D, D]",
         B * H * NC * D * D * F32),
        (text(zh="进入每个块的状态，bf16", en="state entering each chunk, bf16"), "[B, H, NC, D, D]",
         B * H * NC * D * D * BF16),
        ("Qw, Kw, W, U (bf16)", "[B, T, H, D] x 4", 4 * tokens * D * BF16),
        (text(zh="A_qk（bf16）与块衰减（float32）", en="A_qk (bf16) and the chunk decay (float32)"),
         "[B, T, H, C], [B, H, NC, D]", tokens * C * BF16 + B * H * NC * D * F32),
    ]
    for what, shape, nbytes in items:
        table.rows.append([f"{B}, {T}, {H}, {D}", what, shape, nbytes / 1e6,
                           ledger.floor_seconds(0, 2 * nbytes) * 1e3])
print(table)
print("\n" + text(zh="第一行是任何反向都要读的；其余各行是可选的。"
                     "每块存一个 float32 状态，与 q、k、v 和 dO 加起来一样大。",
                 en="The first row is read by any backward; the others are choices. A float32 state per chunk is "
                    "as large as q, k, v and dO together."))
