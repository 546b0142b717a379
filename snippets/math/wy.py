# snippet: cpu
"""The WY form inside one chunk: the weighted residuals beta_i (v_i - S_{i-1}^T k_i) that the
token recurrence produces, from any start state S, equal U - W S with U and W computed without
S (float64, KDA gates, keys L2-normalised)."""
import torch

from kda.metrics import rel_l2
from kda.reference.level0 import chunk_wy
from kda.site.runtime import text
from kda.tables import Table, sci

g = torch.Generator().manual_seed(0)
table = Table(["C", "d_k", "d_v", text(zh="每步门控", en="gate per step"),
               text(zh="U - W S 对比递推的 rel L2", en="rel L2 of U - W S against the recurrence"), "max exp(-G)"],
              formats=[None, None, None, None, sci, sci])
for C, dk, dv, strength in [(4, 3, 2, 0.1), (16, 8, 8, 0.5), (64, 64, 32, 0.05), (64, 64, 32, 3.0)]:
    k = torch.nn.functional.normalize(torch.randn(C, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(C, dv, generator=g, dtype=torch.float64)
    gate = -strength * torch.rand(C, dk, generator=g, dtype=torch.float64)
    beta = torch.rand(C, generator=g, dtype=torch.float64)
    S0 = torch.randn(dk, dv, generator=g, dtype=torch.float64)
    # the recurrence, keeping every weighted residual
    S, residuals = S0.clone(), []
    for i in range(C):
        S = torch.exp(gate[i])[:, None] * S
        r = beta[i] * (v[i] - S.T @ k[i])
        residuals.append(r)
        S = S + torch.outer(k[i], r)
    U, W, _ = chunk_wy(k, v, gate, beta)
    largest = torch.exp(-torch.cumsum(gate, 0)).max().item()
    table.rows.append([C, dk, dv, f"U(-{strength}, 0)", rel_l2(U - W @ S0, torch.stack(residuals)), largest])
print(table)
