# snippet: cpu
"""The measured limits of the single-GEMM factorization against the chunk length, with the line
where e^(C |g|) reaches the largest finite number of each format."""
import math

import matplotlib.pyplot as plt

from kda.site.runtime import figure, text
from kda.tables import level3

table = level3.factorization_limits()
largest = {"fp32": 3.4028235e38, "bf16": 3.3895314e38, "fp16": 65504.0}
fig, ax = plt.subplots(figsize=(6, 3.6))
for (name, style), color in zip((("fp32", "o"), ("bf16", "x"), ("fp16", "s")), ("C0", "C1", "C2")):
    rows = [r for r in table.rows if r[1] == name]
    ax.plot([r[0] for r in rows], [-r[2] for r in rows], style, color=color,
            label=text(zh=f"实测，{name} 操作数", en=f"measured, {name} operands"))
    C = [16, 32, 64]
    ax.plot(C, [math.log(largest[name]) / c for c in C], "--", color=color, lw=0.8,
            label=text(zh=f"e^(C|g|) = {name} 的最大有限数", en=f"e^(C|g|) = largest {name}"))
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks([16, 32, 64], ["16", "32", "64"])
ax.set_xlabel(text(zh="块长 C", en="chunk length C"))
ax.set_ylabel(text(zh="失效处的每步 |g|", en="|g| per step where it fails"))
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))     # beside the axes: it covers no point
figure(fig, "limits", text(zh="因式分解的块内分数在哪里失效，随块长变化",
                           en="where the factorized intra scores fail, against the chunk length"))
