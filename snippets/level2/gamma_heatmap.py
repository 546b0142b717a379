# snippet: cpu
"""The decay-aware mask Gamma = causality (M) times forgetting (D): the worked example alpha = 0.5,
C = 4 (gamma = cumulative products), the full D for alpha = 0.9, C = 4 with its entries above 1,
and a heatmap of Gamma for alpha = 0.9, C = 64."""
import matplotlib.pyplot as plt
import torch

from kda.reference.level2 import decay_weights
from kda.site.runtime import figure, text


def show(matrix, name):
    print(f"{name}\n")
    print("| i \\ j | " + " | ".join(str(j + 1) for j in range(matrix.shape[1])) + " |")
    print("|---" * (matrix.shape[1] + 1) + "|")
    for i, row in enumerate(matrix.tolist()):
        print(f"| {i + 1} | " + " | ".join(f"{x:.4g}" for x in row) + " |")
    print()


C = 4
gamma = torch.cumprod(torch.full((C,), 0.5, dtype=torch.float64), 0)
print(text(zh="alpha = 0.5 时的 gamma：",
           en="gamma for alpha = 0.5: ") + ", ".join(f"{x:.4g}" for x in gamma.tolist())
      + "\n")
show(torch.where(torch.ones(C, C, dtype=torch.bool).tril(), gamma[:, None] / gamma[None, :], 0.0),
     text(zh="Gamma = gamma_i / gamma_j（j <= i），alpha = 0.5：",
          en="Gamma = gamma_i / gamma_j for j <= i, alpha = 0.5:"))
g9 = torch.cumprod(torch.full((C,), 0.9, dtype=torch.float64), 0)
show(g9[:, None] / g9[None, :], text(zh="D = gamma_i / gamma_j（所有位置），alpha = 0.9（对角线上方：> 1）：",
                                     en="D = gamma_i / gamma_j everywhere, alpha = 0.9 (above the diagonal: > 1):"))

C = 64
Gamma, *_ = decay_weights(torch.tensor([0.9], dtype=torch.float64), C, torch.tensor([C]))
fig, ax = plt.subplots(figsize=(4.2, 3.6))
im = ax.imshow(Gamma[0].numpy(), cmap="viridis")
ax.set_xlabel(text(zh="j（key 在块内的位置）", en="j (key position in the chunk)"))
ax.set_ylabel(text(zh="i（query 的位置）", en="i (query position)"))
ax.set_title("Gamma, alpha = 0.9, C = 64")
fig.colorbar(im, ax=ax)
figure(fig, "gamma-heatmap", text(zh="衰减感知掩码的热图", en="heatmap of the decay-aware mask"))
