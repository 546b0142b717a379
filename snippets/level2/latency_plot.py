# snippet: cpu uses=snippets/level2/latency.py
"""Level-2 latency against T from the H200 record of latency.py, log-log."""
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kda.site.runtime import figure, recorded_data

rows = recorded_data("snippets/level2/latency.py")["rows"]
T = [r["T"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.6))
for key, label, style in [("fla", "fla chunk_simple_gla (g_gamma)", "s--"), ("kda", "kda decay_attention", "^-"),
                          ("kda_pipelined", "this chapter's pipelined kernel", "o-."),
                          ("floor", "hardware floor", ":")]:
    ax.loglog(T, [r[key] for r in rows], style, label=label)
ax.set_xticks(T, [str(t) for t in T])             # the measured lengths; matplotlib's minor
ax.xaxis.set_minor_formatter(NullFormatter())     # labels (2 x 10^3, 3 x 10^3, ...) overlapped
ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
ax.set_ylabel("latency (ms)")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
figure(fig, "latency-vs-t", "level-2 latency against T on the H200")
