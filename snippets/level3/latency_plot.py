# snippet: cpu uses=snippets/level3/latency.py
"""Level-3 latency at T = 32768 from the H200 record of latency.py: kda (by stage) beside fla."""
import matplotlib.pyplot as plt

from kda.site.runtime import figure, recorded_data, text

record = recorded_data("snippets/level3/latency.py")
stages = {(s["form"], s["stage"]): s["ms"] for s in record["stages"]}
fig, ax = plt.subplots(figsize=(6.4, 3.4))
bars = [
    ("scalar", text(zh="kda，标量门控", en="kda, scalar"),
     [("chunk_cumsum", text(zh="前缀和", en="cumsum")),
      ("seq_in_loop_scalar", text(zh="融合遍历", en="fused pass"))]),
    ("per channel", text(zh="kda，逐通道门控", en="kda, per channel"),
     [("chunk_intra(delta=False)", text(zh="块内阶段", en="intra-chunk stage")),
      ("seq_in_loop_per_channel", text(zh="顺序遍历", en="sequential pass"))]),
]
colors = {"chunk_cumsum": "#8fbbd9", "seq_in_loop_scalar": "#1f77b4", "chunk_intra(delta=False)": "#ff7f0e",
          "seq_in_loop_per_channel": "#9467bd"}
labels, y = [], 0
for form, name, parts in bars:
    row = next(r for r in record["rows"] if r["op"] == f"gated, {form.replace(' ', '-')} g")
    peer = next(name for name in row["ms"] if name.startswith("fla "))
    left = 0.0
    for stage, label in parts:
        ax.barh(y, stages[(form, stage)], left=left, color=colors[stage], edgecolor="white", label=label)
        left += stages[(form, stage)]
    # the stages named after the bar, clear of it and of the floor lines; the legend has the colours
    ax.text(left + 0.05, y, " + ".join(label for _, label in parts), ha="left", va="center", fontsize=7)
    labels.append(name)
    ax.barh(y + 1, row["ms"][peer], color="#2ca02c", label="fla" if form == "per channel" else None)
    labels.append(peer)
    ax.vlines(row["floor"], y - 0.45, y + 1.45, color="k", ls=":", lw=0.8)   # the floor of this pair
    y += 2
ax.set_yticks(range(len(labels)))
ax.tick_params(axis="y", labelleft=False)
for i, name in enumerate(labels):          # as texts, not tick labels: each language's image gets its own words
    ax.text(-0.02, i, name, transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=8)
ax.set_xlabel(text(zh="ms（B = 1, T = 32768, H = 32, D = 128, bf16；点线：硬件下限）",
                   en="ms (B = 1, T = 32768, H = 32, D = 128, bf16; dotted: hardware floors)"))
ax.invert_yaxis()
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ax.grid(True, axis="x", alpha=0.3)
figure(fig, "stages", text(zh="第三级各阶段的延迟，与 fla 对比（H200）",
                           en="level-3 latency by stage against fla on the H200"))
