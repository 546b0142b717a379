# snippet: cpu
"""The level-4 references agree in float64: the token recurrence (A), the chunked WY form with
the exact inverse (B), and the kernel mimic (blocked inverse, W/U, the state pass with snapshots,
the output), tails included, b from 0 to 1, L2-normalized keys, an initial state."""
import torch

from kda.metrics import rel_l2 as rel
from kda.reference import level4 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

torch.manual_seed(0)
table = Table(["T", text(zh="块长", en="chunk"), text(zh="(B) 分块", en="(B) chunked"),
               text(zh="kernel 模仿", en="kernel mimic"), text(zh="最终状态", en="final states")],
              formats=[None, None, sci, sci, sci])
for T, C in [(1, 16), (70, 16), (200, 64), (256, 64)]:
    q, v = torch.randn(2, T, 3, 16, dtype=torch.float64), torch.randn(2, T, 3, 8, dtype=torch.float64)
    k = ref.l2_normalize(torch.randn(2, T, 3, 16, dtype=torch.float64))
    beta = torch.rand(2, T, 3, dtype=torch.float64)
    h0 = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    o_a, s_a = ref.recurrent(q, k, v, beta, h0, True)
    forms = [ref.chunked(q, k, v, beta, C, h0, True), ref.kernel_mimic(q, k, v, beta, 1.0, C, h0, True)]
    table.rows.append([T, C, rel(forms[0][0], o_a), rel(forms[1][0], o_a), max(rel(s, s_a) for _, s in forms)])
print(text(zh="与逐 token 递推（A）的相对 L2 差异：\n", en="Relative L2 difference from the token recurrence (A):\n"))
print(table)
