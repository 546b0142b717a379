# snippet: cpu uses=snippets/level1/latency.py
"""Latency against T from the H200 record of latency.py, log-log."""
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kda.site.runtime import figure, recorded_data, text

rows = recorded_data("snippets/level1/latency.py")["rows"]
T = [r["T"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.6))
for key, label, style in [("seq_in_grid", "kda seq_in_grid", "o-"), ("fla", "fla chunk_linear_attn", "s--"),
                          ("kda_fused", text(zh="kda 融合 kernel (seq_in_loop)", en="kda fused (seq_in_loop)"), "v-"),
                          ("kda", "kda.linear_attention", "^-"),
                          ("floor", text(zh="硬件下限", en="hardware floor"), ":")]:
    ax.loglog(T, [r[key] for r in rows], style, label=label)
ax.set_xticks(T, [str(t) for t in T])             # the measured lengths; matplotlib's minor
ax.xaxis.set_minor_formatter(NullFormatter())     # labels (2 x 10^3, 3 x 10^3, ...) overlapped
ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
ax.set_ylabel(text(zh="延迟（ms）", en="latency (ms)"))
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)   # outside: inside, it covered data
figure(fig, "latency-vs-t", text(zh="第一级在 H200 上的延迟随 T 的变化", en="level-1 latency against T on the H200"))
