# snippet: cpu
"""The level-5 references agree in float64: the token recurrence (level 0's ``recurrent``), the
chunked form (``chunked``), the chunks' affine maps composed over the sequence
(``kda.distributed.local_affine_map``) for the final state, and the kernel mimic
(``kda.reference.level5``); KDA and GDN, gates down to -20 per step, tails, an initial state."""
import torch

from kda.distributed import local_affine_map
from kda.metrics import rel_l2 as rel
from kda.reference import level0, level5
from kda.reference.level4 import l2_normalize
from kda.site.runtime import text
from kda.tables import Table, sci

table = Table([text(zh="门控", en="gate"), "T", text(zh="最强的门控", en="strongest gate"),
               text(zh="分块", en="chunked"), text(zh="kernel 模仿", en="kernel mimic"),
               text(zh="复合映射得到的最终状态", en="final state by composed maps")],
              formats=[None, None, None, sci, sci, sci])
gen = torch.Generator().manual_seed(0)
for form, per_channel_gate in [(text(zh="KDA（逐通道）", en="KDA (per channel)"), True),
                               (text(zh="GDN（标量）", en="GDN (scalar)"), False)]:
    for T, strength in [(1, 1.0), (130, 1.0), (200, 20.0)]:
        q = torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen)
        v = torch.randn(2, T, 3, 8, dtype=torch.float64, generator=gen)
        k = l2_normalize(torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen))
        g = -strength * torch.rand(2, T, 3, *((16,) if per_channel_gate else ()), dtype=torch.float64, generator=gen)
        beta = torch.rand(2, T, 3, dtype=torch.float64, generator=gen)
        h0 = torch.randn(2, 3, 16, 8, dtype=torch.float64, generator=gen)
        o_a, s_a = level0.recurrent(q, k, v, g, beta, h0, True)
        o_b, _ = level0.chunked(q, k, v, g, beta, 64, h0, True)
        o_m, _ = level5.kernel_mimic(q, k, v, g, beta, 1.0, 64, h0, True)
        M, Bm = local_affine_map(k, v, g, beta)                  # the chunks' maps, composed
        table.rows.append([form, T, text(zh=f"每步 -{strength:g}", en=f"-{strength:g} per step"),
                           rel(o_b, o_a), rel(o_m, o_a), rel(M @ h0 + Bm, s_a)])
print(text(zh="与逐 token 递推的相对 L2 差异：\n", en="Relative L2 difference from the token recurrence:\n"))
print(table)
