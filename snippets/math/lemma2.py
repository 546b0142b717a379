# snippet: cpu
"""Lemma 2: the inverse of a unit lower-triangular L = I + N by forward substitution, against
torch.linalg.solve_triangular and against the finite series sum_k (-N)^k (float64)."""
import torch

from kda.metrics import rel_l2
from kda.reference.level0 import forward_substitution
from kda.site.runtime import text
from kda.tables import Table, sci

g = torch.Generator().manual_seed(0)
table = Table(["C", text(zh="前向代入对比 solve_triangular", en="forward substitution vs solve_triangular"),
               text(zh="级数对比 solve_triangular", en="series vs solve_triangular"),
               "‖L X − I‖ / ‖I‖"], formats=[None, sci, sci, sci])
for C in (4, 16, 64):
    N = torch.randn(C, C, generator=g, dtype=torch.float64).tril(-1) / C ** 0.5   # strictly lower
    eye = torch.eye(C, dtype=torch.float64)
    L = eye + N
    X = forward_substitution(L, eye)
    reference = torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True)
    series, power = eye.clone(), eye.clone()
    for _ in range(C - 1):                       # N is nilpotent: N^C = 0, so the series ends
        power = power @ (-N)
        series = series + power
    table.rows.append([C, rel_l2(X, reference), rel_l2(series, reference), rel_l2(L @ X, eye)])
print(table)
