# snippet: cpu
"""Lemma 1: a sum of outer products is one matrix product, sum_i k_i v_i^T = K^T V (float64)."""
import torch

from kda.metrics import rel_l2
from kda.site.runtime import text
from kda.tables import Table, sci

g = torch.Generator().manual_seed(0)
table = Table(["C", "d_k", "d_v", text(zh="K^T V 对比逐项求和循环的 rel L2", en="rel L2 of K^T V against the loop")],
              formats=[None, None, None, sci])
for C, dk, dv in [(4, 3, 5), (64, 128, 128), (64, 64, 32)]:
    K = torch.randn(C, dk, generator=g, dtype=torch.float64)
    V = torch.randn(C, dv, generator=g, dtype=torch.float64)
    loop = sum(torch.outer(K[i], V[i]) for i in range(C))
    table.rows.append([C, dk, dv, rel_l2(K.T @ V, loop)])
print(table)
