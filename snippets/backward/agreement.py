# snippet: cpu
"""The hand-derived backward (kda.reference.backward) against autograd through the float64 token
recurrence of each level, on one loss sum(o * dO) + sum(S_T * dS_T): two sequences of 100 tokens
(one chunk of 64 and a tail), 4 heads, d_k = 16, d_v = 8, an initial state, scale 1/4."""
import torch

from kda.metrics import rel_l2
from kda.reference import backward as bwd
from kda.reference import level4 as ref4
from kda.site.runtime import text
from kda.tables import Table, sci

B, T, H, K, V, scale = 2, 100, 4, 16, 8, 0.25
gen = torch.Generator().manual_seed(0)
rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
q, v, h0, dO, dS = rand(B, T, H, K), rand(B, T, H, V), rand(B, H, K, V), rand(B, T, H, V), rand(B, H, K, V)
k = ref4.l2_normalize(rand(B, T, H, K))
beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
strong = torch.nn.functional.logsigmoid(rand(B, T, H, K))
strong[:, 20:90] = -20.0                                # 70 tokens at -20: a fall of e^-1400

per_head, per_channel = (lambda: torch.nn.functional.logsigmoid(rand(B, T, H)),
                         lambda: torch.nn.functional.logsigmoid(rand(B, T, H, K)))
CASES = [(text(zh="1 线性注意力", en="1 linear attention"), None, False),
         (text(zh="2-3 每头门控", en="2-3 gates per head"), per_head(), False),
         (text(zh="3 逐通道门控", en="3 gates per channel"), per_channel(), False),
         (text(zh="4 delta 规则", en="4 delta rule"), None, True),
         ("5 GDN", per_head(), True), ("5 KDA", per_channel(), True),
         (text(zh="5 KDA，连续取 -20", en="5 KDA, runs of -20"), strong, True)]
cell = lambda x: "-" if x is None else sci(x)          # "-": the level has no such input
table = Table([text(zh="级", en="level"), "dq", "dk", "dv", "dg", "dbeta", "dh0"], formats=[None] + [cell] * 6)
for name, g, delta in CASES:
    b = beta if delta else None
    ours = bwd.chunked_backward(q, k, v, g, b, dO, dS, scale=scale, chunk_size=64, initial_state=h0)
    want = bwd.recurrence_backward(q, k, v, g, b, dO, dS, scale=scale, initial_state=h0)
    table.rows.append([name] + [rel_l2(a, w) if w is not None else None for a, w in zip(ours, want)])
print(text(zh="与经过逐 token 递推的 autograd 之间的相对 L2 差：",
           en="Relative L2 difference from autograd through the token recurrence:") + "\n")
print(table)
