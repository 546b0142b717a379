# snippet: cpu
"""FLOP ledger of article 000 section 6.3 (D = 64, BC = 64), as a table and a log-log plot."""
import matplotlib.pyplot as plt

from kda import ledger
from kda.site.runtime import figure, text
from kda.tables import level1

D, C = 64, 64
print(level1.flop_ledger(D=D, C=C, Ns=(512, 2048, 8192, 16384, 65536)))

Ns = [2 ** p for p in range(9, 18)]
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.loglog(Ns, [ledger.seq_in_grid_state_flops(n, D, C) for n in Ns], "o-",
          label=text(zh="序列在 grid 里，步骤①", en="sequence in grid, step (1)"))
ax.loglog(Ns, [ledger.causal_attention_flops(n, D) for n in Ns], "s--",
          label=text(zh="因果 softmax 注意力", en="causal softmax attention"))
ax.loglog(Ns, [ledger.chunked_ideal_flops(n, D, C) for n in Ns], "^-",
          label=text(zh="分块，每块只算一次", en="chunked, each chunk once"))
ax.set_xlabel(text(zh="序列长度 N", en="sequence length N"))
ax.set_ylabel("FLOPs")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
figure(fig, "flops-vs-n", text(zh="FLOPs 随 N 的变化，双对数坐标", en="FLOPs against N, log-log"))
