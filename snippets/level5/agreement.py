# snippet: cpu
"""The level-5 references agree in float64: the token recurrence (level 0's ``recurrent``), the
chunked form (``chunked``), the composition of the chunk affine maps (``chunk_affine`` and
``compose``) for the final state, and the kernel mimic (``kda.reference.level5``); KDA and GDN,
gates down to -20 per step, tails, an initial state."""
import torch

from kda.reference import level0, level5
from kda.reference.level3 import per_channel
from kda.reference.level4 import l2_normalize
from kda.tables import Table, sci

rel = lambda x, y: ((x - y).norm() / y.norm()).item()
table = Table(["gate", "T", "strongest gate", "chunked", "kernel mimic", "final state by composed maps"],
              formats=[None, None, None, sci, sci, sci])
gen = torch.Generator().manual_seed(0)
for form, per_channel_gate in [("KDA (per channel)", True), ("GDN (scalar)", False)]:
    for T, strength in [(1, 1.0), (130, 1.0), (200, 20.0)]:
        q, v = torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen), torch.randn(2, T, 3, 8, dtype=torch.float64, generator=gen)
        k = l2_normalize(torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen))
        g = -strength * torch.rand(2, T, 3, *((16,) if per_channel_gate else ()), dtype=torch.float64, generator=gen)
        beta = torch.rand(2, T, 3, dtype=torch.float64, generator=gen)
        h0 = torch.randn(2, 3, 16, 8, dtype=torch.float64, generator=gen)
        o_a, s_a = level0.recurrent(q, k, v, g, beta, h0, True)
        o_b, _ = level0.chunked(q, k, v, g, beta, 64, h0, True)
        o_m, _ = level5.kernel_mimic(q, k, v, g, beta, 1.0, 64, h0, True)
        heads = lambda x: x.transpose(1, 2)                   # chunk_affine works on [B, H, C, D]
        gk = per_channel(g, 16)
        maps = [level0.chunk_affine(heads(k[:, s:s + 64]), heads(v[:, s:s + 64]), heads(gk[:, s:s + 64]),
                                    beta[:, s:s + 64].transpose(1, 2)) for s in range(0, T, 64)]
        M, Bm = maps[0]
        for nxt in maps[1:]:
            M, Bm = level0.compose((M, Bm), nxt)
        table.rows.append([form, T, f"-{strength:g} per step", rel(o_b, o_a), rel(o_m, o_a), rel(M @ h0 + Bm, s_a)])
print("Relative L2 difference from the token recurrence:\n")
print(table)
