# snippet: cpu
"""Why the mask is evaluated, not applied: building D = alpha^(i-j) everywhere and multiplying
by the 0/1 mask turns the overflowing upper triangle into inf * 0 = NaN in fp16, while evaluating
only where j <= i never forms a factor above 1. One chunk, C = 64, fp16 storage."""
import torch

from kda.site.runtime import text
from kda.tables import Table

C = 64
i = torch.arange(C, dtype=torch.float64)
mask = torch.ones(C, C).tril().half()
table = Table(["alpha", text(zh="D 的最大元素（fp16）", en="largest entry of D (fp16)"),
               text(zh="D * M 中的 NaN 数", en="NaN in D * M"),
               text(zh="只在 j <= i 处求值时的 NaN 数", en="NaN when evaluated for j <= i")])
for a in (0.99, 0.9, 0.8, 0.5):
    D = (a ** (i[:, None] - i[None, :])).half()                 # a^(i-j) for all i, j
    masked = D * mask
    evaluated = torch.where(i[:, None] >= i[None, :], a ** (i[:, None] - i[None, :]).clamp(min=0), 0.0).half()
    table.rows.append([a, f"{D.float().max().item():.4g}", int(masked.isnan().sum()), int(evaluated.isnan().sum())])
print(table)
