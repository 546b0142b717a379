# snippet: cpu
"""The four-step hand expansion of one chunk (C = 4, per-step decays a_1..a_4): the coefficient
of the entering state and of each v_r k_r^T in S_4, read off by running the recurrence on
one-hot inputs, next to the cumulative-product formula gamma_4 / gamma_r."""
import torch

from kda.reference import level2 as ref
from kda.site.runtime import text
from kda.tables import Table

a = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)      # a_1 .. a_4
gamma = torch.cumprod(a, 0)                                        # gamma_r = a_1 ... a_r
C = 4
table = Table([text(zh="S_4 中的项", en="term in S_4"),
               text(zh="由递推读出的系数", en="coefficient from the recurrence"),
               text(zh="公式", en="formula"), text(zh="公式的值", en="value of the formula")],
              formats=[None, "{:.6f}", None, "{:.6f}"])

# the entering state: start from S = 1 (d = 1), no inputs
zero = torch.zeros(1, C, 1, 1, dtype=torch.float64)
_, S = ref.recurrent(zero, zero, zero, a[None, :, None], torch.ones(1, 1, 1, 1, dtype=torch.float64), True)
table.rows.append([text(zh="S_[t]（进块状态）", en="S_[t] (entering state)"), S.item(), "gamma_4", gamma[-1].item()])
# each token alone: k_r = v_r = 1 at position r, zero elsewhere
for r in range(C):
    kv = torch.zeros(1, C, 1, 1, dtype=torch.float64)
    kv[0, r] = 1.0
    _, S = ref.recurrent(zero, kv, kv, a[None, :, None], None, True)
    table.rows.append([f"v_{r + 1} k_{r + 1}^T", S.item(), f"gamma_4 / gamma_{r + 1}", (gamma[-1] / gamma[r]).item()])
print(table)
