# snippet: cpu uses=snippets/level2/latency.py
"""Level-2 latency against T from the H200 record of latency.py, log-log."""
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kda.site.runtime import figure, recorded_data, text

rows = recorded_data("snippets/level2/latency.py")["rows"]
T = [r["T"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.6))
for key, label, style in [("fla", "fla chunk_simple_gla (g_gamma)", "s--"), ("kda", "kda decay_attention", "^-"),
                          ("kda_pipelined", text(zh="本章的流水线 kernel", en="this chapter's pipelined kernel"),
                           "o-."),
                          ("floor", text(zh="硬件下限", en="hardware floor"), ":")]:
    ax.loglog(T, [r[key] for r in rows], style, label=label)
ax.set_xticks(T, [str(t) for t in T])             # the measured lengths; matplotlib's minor
ax.xaxis.set_minor_formatter(NullFormatter())     # labels (2 x 10^3, 3 x 10^3, ...) overlapped
ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
ax.set_ylabel(text(zh="延迟（ms）", en="latency (ms)"))
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)   # outside: inside, it covered data
figure(fig, "latency-vs-t", text(zh="第二级在 H200 上的延迟随 T 的变化", en="level-2 latency against T on the H200"))
