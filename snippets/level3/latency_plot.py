# snippet: cpu uses=snippets/level3/latency.py
"""Level-3 latency at T = 32768 from the H200 record of latency.py: kda (by stage) beside fla."""
import matplotlib.pyplot as plt

from kda.site.runtime import figure, recorded_data

record = recorded_data("snippets/level3/latency.py")
stages = {(s["form"], s["stage"]): s["ms"] for s in record["stages"]}
fig, ax = plt.subplots(figsize=(6.4, 3.4))
bars = [
    ("scalar", [("chunk_cumsum", "cumsum"), ("seq_in_loop_scalar", "fused pass")]),
    ("per channel", [("chunk_intra(delta=False)", "intra-chunk stage"), ("seq_in_loop_per_channel", "sequential pass")]),
]
colors = {"cumsum": "#8fbbd9", "fused pass": "#1f77b4", "intra-chunk stage": "#ff7f0e", "sequential pass": "#1f77b4"}
labels, y = [], 0
for form, parts in bars:
    row = next(r for r in record["rows"] if r["op"] == f"gated, {form.replace(' ', '-')} g")
    peer = next(name for name in row["ms"] if name.startswith("fla "))
    left = 0.0
    for stage, label in parts:
        ax.barh(y, stages[(form, stage)], left=left, color=colors[label], edgecolor="white", label=label)
        if stages[(form, stage)] > 0.4:                # label the wide segments; the legend has all
            ax.text(left + stages[(form, stage)] / 2, y, label, ha="center", va="center", fontsize=7)
        left += stages[(form, stage)]
    labels.append(f"kda, {form}")
    ax.barh(y + 1, row["ms"][peer], color="#2ca02c")
    labels.append(peer)
    ax.axvline(row["floor"], ymin=0, ymax=1, color="k", ls=":", lw=0.8)
    y += 2
ax.set_yticks(range(len(labels)), labels, fontsize=8)
ax.set_xlabel("ms (B = 1, T = 32768, H = 32, D = 128, bf16; dotted: hardware floors)")
ax.invert_yaxis()
ax.legend(fontsize=7, loc="upper right")
ax.grid(True, axis="x", alpha=0.3)
figure(fig, "stages", "level-3 latency by stage against fla on the H200")
