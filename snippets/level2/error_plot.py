# snippet: cpu uses=snippets/level2/kernel_error.py
"""Plot of the per-chunk error recorded on the H200 by kernel_error.py."""
import matplotlib.pyplot as plt

from kda.site.runtime import figure, recorded_data, text

data = recorded_data("snippets/level2/kernel_error.py")
fig, ax = plt.subplots(figsize=(6, 3.4))
for alpha, errs in data["per_chunk_rel_l2"].items():
    ax.semilogy(range(len(errs)), errs, label=f"alpha = {alpha}", lw=0.8)
ax.set_xlabel(text(zh=f"块号（chunk = {data['chunk_size']} 个 token，{data['dtype']}）",
                   en=f"chunk index (chunk = {data['chunk_size']} tokens, {data['dtype']})"))
ax.set_ylabel(text(zh="该块的相对 L2 误差", en="relative L2 error of the chunk"))
ax.grid(True, which="both", alpha=0.3)
ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)   # above the axes: inside, it covered data
figure(fig, "error-vs-chunk", text(zh="衰减 kernel 的逐块误差", en="per-chunk error of the decay kernel"))
