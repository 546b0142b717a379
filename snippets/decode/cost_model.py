# snippet: cpu
"""What one decode step moves and computes, H = 32 heads, K = V = 128, one token per sequence:
the float32 states read and written once dominate, so the step is bound by memory at any batch."""
from kda import ledger
from kda.site.runtime import text
from kda.tables import Table

H, K, V = 32, 128, 128
table = Table(["batch", text(zh="状态读写（MB）", en="state traffic (MB)"),
               text(zh="token 读写（MB）", en="token traffic (MB)"),
               "GFLOP", text(zh="每字节 FLOP", en="FLOP per byte"), text(zh="下限（us）", en="floor (us)")],
              formats=[None, "{:.1f}", "{:.3f}", "{:.3f}", "{:.2f}", "{:.1f}"])
for B in (1, 64, 512):
    state = 2 * B * H * K * V * 4                        # read and written back, float32
    tokens = B * H * (2 * K + 2 * V) * 2 + B * H * (K + 1) * 4   # q, k, v, o in bf16; g, beta in float32
    flops = B * H * 6 * K * V                            # decay, S^T k, the rank-1 update, S^T q: about 6 K V
    floor = ledger.floor_seconds(flops, state + tokens) * 1e6
    table.rows.append([B, state / 1e6, tokens / 1e6, flops / 1e9, flops / (state + tokens), floor])
print(table)
ridge = ledger.H200_BF16_FLOPS / ledger.H200_HBM_BYTES_PER_S
print("\n" + text(zh=f"H200 要每字节约 {ridge:.0f} FLOP 才会受算力限制；解码一步不到 1。",
                 en=f"The H200 needs about {ridge:.0f} FLOP per byte to be bound by arithmetic; "
                    "a decode step has under 1."))
