# snippet: cpu
"""What the backward of chunk_kda could keep in HBM from the forward, at the two shapes of the
speed goal (bf16 inputs, per-channel float32 gates, chunks of 64): bytes, and the time to write
them once and read them back once at 4.3 TB/s, against the bytes the backward must move anyway."""
from kda import ledger
from kda.chunking import CHUNK_SIZE as C
from kda.tables import Table

BF16, F32 = 2, 4
table = Table(["B, T, H, D", "kept from the forward", "shape", "MB", "write + read (ms)"],
              formats=[None, None, None, "{:,.0f}", "{:.3f}"])
for B, T, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
    NC, tokens = T // C, B * T * H
    items = [
        ("inputs and dO (q, k, v, dO bf16; g, beta float32)", "[B, T, H, *]",
         tokens * (4 * D * BF16 + (D + 1) * F32)),
        ("state entering each chunk, float32", "[B, H, NC, D, D]", B * H * NC * D * D * F32),
        ("state entering each chunk, bf16", "[B, H, NC, D, D]", B * H * NC * D * D * BF16),
        ("Qw, Kw, W, U (bf16)", "[B, T, H, D] x 4", 4 * tokens * D * BF16),
        ("A_qk (bf16) and the chunk decay (float32)", "[B, T, H, C], [B, H, NC, D]",
         tokens * C * BF16 + B * H * NC * D * F32),
    ]
    for what, shape, nbytes in items:
        table.rows.append([f"{B}, {T}, {H}, {D}", what, shape, nbytes / 1e6,
                           ledger.floor_seconds(0, 2 * nbytes) * 1e3])
print(table)
print("\nThe first row is read by any backward; the others are choices. A float32 state per chunk is "
      "as large as q, k, v and dO together.")
