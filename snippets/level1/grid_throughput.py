# snippet: cpu uses=snippets/level1/latency.py
"""What the sequence-in-grid kernel does with its redundant GEMMs: the FLOPs of step (1) from the
ledger over the time recorded on the H200, against the 686 TFLOP/s bf16 ceiling."""
from kda import ledger
from kda.site.runtime import recorded_data, text
from kda.tables import Table

record = recorded_data("snippets/level1/latency.py")
B, H, D, C = record["B"], record["H"], record["D"], 64
table = Table(["T", text(zh="步骤① FLOPs（所有 head）", en="step (1) FLOPs (all heads)"), "seq_in_grid (ms)",
               text(zh="实际达到的 TFLOP/s", en="achieved TFLOP/s"),
               text(zh="占 686 TFLOP/s 的比例", en="of 686 TFLOP/s")],
              formats=[None, "{:.2e}", "{:.2f}", "{:.0f}", "{:.0%}"])
for row in record["rows"]:
    flops = B * H * ledger.seq_in_grid_state_flops(row["T"], D, C)
    tflops = flops / (row["seq_in_grid"] * 1e-3) / 1e12
    table.rows.append([row["T"], float(flops), row["seq_in_grid"], tflops, tflops * 1e12 / ledger.H200_BF16_FLOPS])
print(table)
