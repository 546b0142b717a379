# snippet: cpu uses=snippets/level3/latency.py
"""Level-3 latency at T = 32768 from the H200 record of latency.py: kda (by stage) beside fla."""
import matplotlib.pyplot as plt

from kda.site.runtime import figure, recorded_data

record = recorded_data("snippets/level3/latency.py")
stages = {(s["form"], s["stage"]): s["ms"] for s in record["stages"]}
fig, ax = plt.subplots(figsize=(6.4, 3.4))
bars = [
    ("scalar", [("validate_gates", "check"), ("chunk_cumsum", "cumsum"), ("seq_in_loop_scalar", "fused pass")]),
    ("per channel", [("validate_gates", "check"), ("chunk_prepare", "prepare"),
                     ("seq_in_loop_per_channel", "sequential pass")]),
]
colors = {"check": "#bbbbbb", "cumsum": "#8fbbd9", "fused pass": "#1f77b4", "prepare": "#ff7f0e",
          "sequential pass": "#1f77b4"}
labels, y = [], 0
for form, parts in bars:
    row = next(r for r in record["rows"] if r["form"] == form)
    left = 0.0
    for stage, label in parts:
        ax.barh(y, stages[(form, stage)], left=left, color=colors[label], edgecolor="white",
                label=label if (form, label) != ("per channel", "check") else None)
        if stages[(form, stage)] > 0.4:                # label the wide segments; the legend has all
            ax.text(left + stages[(form, stage)] / 2, y, label, ha="center", va="center", fontsize=7)
        left += stages[(form, stage)]
    labels.append(f"kda, {form}")
    ax.barh(y + 1, row["fla"], color="#2ca02c")
    labels.append(f"fla {row['peer']}")
    ax.axvline(row["floor"], ymin=0, ymax=1, color="k", ls=":", lw=0.8)
    y += 2
ax.set_yticks(range(len(labels)), labels, fontsize=8)
ax.set_xlabel("ms (B = 1, T = 32768, H = 32, D = 128, bf16; dotted: hardware floors)")
ax.invert_yaxis()
ax.legend(fontsize=7, loc="upper right")
ax.grid(True, axis="x", alpha=0.3)
figure(fig, "stages", "level-3 latency by stage against fla on the H200")
