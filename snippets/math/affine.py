# snippet: cpu
"""The chunk affine theorem and its composition, checked in float64 on random inputs:
a chunk's (M, B) applied to S against the token recurrence; two chunks' maps composed against
the two-chunk recurrence; and the whole chunkwise algorithm against the recurrence (KDA with
per-channel gates, GDN with a scalar gate, a tail chunk included)."""
import torch

from kda.metrics import rel_l2
from kda.reference import level0 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

gen = torch.Generator().manual_seed(0)
B, T, H, DK, DV, C = 2, 100, 2, 16, 8, 32          # 100 = 3 chunks of 32 and a tail of 4


def randn(*shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


q, v, S0 = randn(B, T, H, DK), randn(B, T, H, DV), randn(B, H, DK, DV)
k = torch.nn.functional.normalize(randn(B, T, H, DK), dim=-1)
beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
gates = {text(zh="KDA（逐通道）", en="KDA (per channel)"):
         -0.3 * torch.rand(B, T, H, DK, generator=gen, dtype=torch.float64),
         text(zh="GDN（标量）", en="GDN (scalar)"): -0.3 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)}


def chunk(x, s):                                     # [B, T, H, ...] -> [B, H, C, ...] for slice s
    return x[:, s].transpose(1, 2)


table = Table([text(zh="门控", en="gates"), text(zh="检验", en="check"), "rel L2"], formats=[None, None, sci])
for name, g in gates.items():
    gk = g[..., None].expand(B, T, H, DK) if g.dim() == 3 else g
    first, second = slice(0, C), slice(C, 2 * C)
    maps = [ref.chunk_affine(chunk(k, s), chunk(v, s), chunk(gk, s),
                             beta[:, s].transpose(1, 2)) for s in (first, second)]
    M, Bm = maps[0]
    _, S_one = ref.recurrent(q[:, first], k[:, first], v[:, first], g[:, first], beta[:, first], S0, True)
    table.rows.append([name, text(zh="M S + B 对比一个 chunk 的递推",
                                  en="M S + B vs one chunk of the recurrence"), rel_l2(M @ S0 + Bm, S_one)])
    M2, B2 = ref.compose(maps[0], maps[1])
    _, S_two = ref.recurrent(q[:, :2 * C], k[:, :2 * C], v[:, :2 * C], g[:, :2 * C], beta[:, :2 * C], S0, True)
    table.rows.append([name, text(zh="复合映射对比两个 chunk 的递推",
                                  en="composed map vs two chunks of the recurrence"), rel_l2(M2 @ S0 + B2, S_two)])
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta, S0, True)
    o, s = ref.chunked(q, k, v, g, beta, C, S0, True)
    table.rows.append([name, text(zh="分块的输出对比递推（T = 100, C = 32）",
                                  en="chunked outputs vs recurrence (T = 100, C = 32)"), rel_l2(o, o_ref)])
    table.rows.append([name, text(zh="分块的最终状态对比递推", en="chunked final state vs recurrence"),
                       rel_l2(s, s_ref)])
print(table)
