# snippet: cpu
"""The level-3 references agree in float64: token recurrence (A), chunked (B), sequence in
grid (C), sequence in loop with sub-chunk scores (D), and the two-stage kernel mimic
(prepare, then the pass), for both gate forms, tails included (T = 200 = 3 chunks + 8),
gates from mild to g = -20 per step, with an initial state and the final state compared."""
import torch

from kda.reference import level3 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

torch.manual_seed(0)
B, T, H, DK, DV = 2, 200, 3, 16, 8
q, k = torch.randn(B, T, H, DK, dtype=torch.float64), torch.randn(B, T, H, DK, dtype=torch.float64)
v = torch.randn(B, T, H, DV, dtype=torch.float64)
h0 = torch.randn(B, H, DK, DV, dtype=torch.float64)


def rel(x, y):
    return ((x - y).norm() / y.norm()).item()


table = Table([text(zh="门控", en="gate"), text(zh="g 的形状", en="form of g"), text(zh="(B) 分块", en="(B) chunked"),
               text(zh="(C) 序列在 grid 里", en="(C) seq in grid"), text(zh="(D) 序列在循环里", en="(D) seq in loop"),
               text(zh="kernel 模仿", en="kernel mimic"), text(zh="最终状态", en="final states")],
              formats=[None, None, sci, sci, sci, sci, sci])
for name, scale in ((text(zh="温和，g 在 [-0.05, 0] 内", en="mild, g in [-0.05, 0]"), 0.05),
                    (text(zh="g 在 [-1, 0] 内", en="g in [-1, 0]"), 1.0),
                    (text(zh="g 在 [-20, 0] 内", en="g in [-20, 0]"), 20.0)):
    for form, shape in (("[B, T, H]", (B, T, H)), ("[B, T, H, DK]", (B, T, H, DK))):
        g = -scale * torch.rand(shape, dtype=torch.float64)
        o_a, s_a = ref.recurrent(q, k, v, g, h0, True)
        forms = [ref.chunked(q, k, v, g, 64, h0, True), ref.seq_in_grid(q, k, v, g, 64, h0, True),
                 ref.seq_in_loop(q, k, v, g, 64, 4, h0, True), ref.kernel_mimic(q, k, v, g, 1.0, 64, h0, True)]
        table.rows.append([name, form, *[rel(o, o_a) for o, _ in forms], max(rel(s, s_a) for _, s in forms)])
print(text(zh="与逐 token 递推（A）的相对 L2 差异：\n", en="Relative L2 difference from the token recurrence (A):\n"))
print(table)
