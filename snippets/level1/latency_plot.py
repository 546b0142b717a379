# snippet: cpu uses=snippets/level1/latency.py
"""Latency against T from the H200 record of latency.py, log-log."""
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kda.site.runtime import figure, recorded_data

rows = recorded_data("snippets/level1/latency.py")["rows"]
T = [r["T"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.6))
for key, label, style in [("seq_in_grid", "kda seq_in_grid", "o-"), ("fla", "fla chunk_linear_attn", "s--"),
                          ("kda_fused", "kda fused (seq_in_loop)", "v-"), ("kda", "kda.linear_attention", "^-"),
                          ("floor", "hardware floor", ":")]:
    ax.loglog(T, [r[key] for r in rows], style, label=label)
ax.set_xticks(T, [str(t) for t in T])             # the measured lengths; matplotlib's minor
ax.xaxis.set_minor_formatter(NullFormatter())     # labels (2 x 10^3, 3 x 10^3, ...) overlapped
ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
ax.set_ylabel("latency (ms)")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
figure(fig, "latency-vs-t", "level-1 latency against T on the H200")
