# snippet: cpu
"""Why the gates are summed in log space. Per-token decays a_t = e^(g_t) multiplied along a
chunk of 64 in fp32 underflow once the product passes 1e-45, and the ratio P_i / P_j that
the weights need becomes 0 / 0. The cumulative sum G of g stays an ordinary number, and
exp(G_i - G_j) is the same weight with no intermediate out of range."""
import torch

from kda.site.runtime import text
from kda.tables import Table, sci

C = 64
table = Table([text(zh="每步 g", en="g per step"), "P_63 = prod a (fp32)", "P_63 / P_62 (fp32)",
               "exp(G_63 - G_62) (fp32)", text(zh="精确的 e^g", en="exact e^g")], formats=[None, sci, sci, sci, sci])
for g in (-0.1, -1.0, -2.0, -5.0):
    a = torch.full((C,), g, dtype=torch.float32).exp()
    P = torch.cumprod(a, dim=0)
    G = torch.cumsum(torch.full((C,), g, dtype=torch.float32), dim=0)
    table.rows.append([g, P[-1].item(), (P[-1] / P[-2]).item(), torch.exp(G[-1] - G[-2]).item(),
                       torch.tensor(g, dtype=torch.float64).exp().item()])
print(table)
