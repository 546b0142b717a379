# snippet: cpu
"""Intra-card split, the CPU form: a sequence cut into P runs of whole chunks, the runs' maps folded
in order, every run recomputed from its true state; against the plain forward (float64, gates in [-0.02, 0], so
that a third of the state survives 100 tokens and the folded start states matter). And how
many blocks the sequential pass gets at B = 1, H = 4, D = 128 (value stripes of 32) with P runs."""
import torch

from kda.distributed import split_forward
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference.level4 import l2_normalize
from kda.site.runtime import text
from kda.tables import Table, sci

gen = torch.Generator().manual_seed(0)
B, T, H, K, V = 1, 520, 2, 32, 16
q = torch.randn(B, T, H, K, dtype=torch.float64, generator=gen)
k = l2_normalize(torch.randn(B, T, H, K, dtype=torch.float64, generator=gen))
v = torch.randn(B, T, H, V, dtype=torch.float64, generator=gen)
g = -0.02 * torch.rand(B, T, H, K, dtype=torch.float64, generator=gen)   # mild: the start state of a run matters
beta = torch.rand(B, T, H, dtype=torch.float64, generator=gen)
h0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=gen)
table = Table([text(zh="门控", en="gate"), text(zh="段数 P", en="runs P"), "rel L2 o",
               text(zh="rel L2 末状态", en="rel L2 final state"),
               text(zh="H = 4 时顺序一趟的 block 数", en="blocks of the sequential pass at H = 4")],
              formats=[None, None, sci, sci, None])
for name, forward, gate in [("KDA", chunk_kda, g), ("GDN", chunk_gated_delta_rule, g[..., 0])]:
    o, s = forward(q, k, v, gate, beta, initial_state=h0, output_final_state=True)
    for P in (2, 3, 9):
        o2, s2 = split_forward(q, k, v, gate, beta, P, initial_state=h0, output_final_state=True)
        blocks = 1 * 4 * (128 // 32) * P
        table.rows.append([name, P, rel_l2(o2, o), rel_l2(s2, s),
                           text(zh=f"{blocks}（对 132 个 SM）", en=f"{blocks} (of 132 SMs)")])
print(f"B, T, H, K, V = {B}, {T}, {H}, {K}, {V}"
      + text(zh="（9 个大小为 64 的块，最后一块不满）", en=" (9 chunks of 64, the last one partial)") + "\n")
print(table)
