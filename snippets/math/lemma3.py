# snippet: cpu
"""Lemma 3: the per-channel decay between positions i and j, exp(G_i - G_j), split as
exp(G_i) * exp(-G_j) so that A = (K e^G)(K e^-G)^T is one GEMM. Exact in real arithmetic; the
factor exp(-G_j) grows like exp(-C g). Below: the split against the pairwise form in float64,
then the per-step gate strength |g| at which the split first overflows in fp32 and fp16."""
import math

import torch

from kda.metrics import rel_l2
from kda.site.runtime import text
from kda.tables import Table, sci

g = torch.Generator().manual_seed(0)
C, dk = 64, 32
K = torch.randn(C, dk, generator=g, dtype=torch.float64)
mask = torch.ones(C, C, dtype=torch.bool).tril()


def pairwise(K, G):
    diff = torch.where(mask[..., None], G[:, None, :] - G[None, :, :], 0.0)   # only j <= i
    return torch.where(mask, torch.einsum("id,jd,ijd->ij", K, K, torch.exp(diff)), 0.0)


def split(K, G, dtype):
    A = (K * torch.exp(G)).to(dtype) @ (K * torch.exp(-G)).to(dtype).T
    return torch.where(mask, A, torch.zeros((), dtype=dtype))


table = Table([text(zh="每步门控 g", en="per-step gate g"),
               text(zh="拆分对比逐对计算，float64 rel L2", en="split vs pairwise, float64 rel L2"),
               text(zh="块内最大的 exp(-G)", en="max exp(-G) in the chunk")], formats=[None, sci, sci])
for step in (-0.01, -0.1, -1.0, -5.0, -20.0):
    G = torch.cumsum(torch.full((C, dk), step, dtype=torch.float64), 0)
    table.rows.append([step, rel_l2(split(K, G, torch.float64), pairwise(K, G)), torch.exp(-G).max().item()])
print(table)


def first_overflow(chunk, dtype):
    """The weakest per-step gate g (on a 0.001 grid) at which the split gives inf or NaN."""
    for i in range(1, 20001):
        G = torch.cumsum(torch.full((chunk, dk), -i / 1000, dtype=torch.float64), 0)
        Kc = K[:chunk]
        factors = (Kc * torch.exp(-G)).to(dtype)
        if not torch.isfinite(factors).all():
            return -i / 1000
    return float("nan")


print()
limits = Table([text(zh="块长 C", en="chunk C"), text(zh="fp32：首次溢出于 g =", en="fp32: first overflow at g ="),
                text(zh="fp16：首次溢出于 g =", en="fp16: first overflow at g ="), "-ln(max)/C (fp32, fp16)"],
               formats=[None, "{:.3f}", "{:.3f}", None])
for chunk in (16, 32, 64):
    bound = ", ".join(f"{-math.log(torch.finfo(dt).max) / chunk:.3f}" for dt in (torch.float32, torch.float16))
    limits.rows.append([chunk, first_overflow(chunk, torch.float32), first_overflow(chunk, torch.float16), bound])
print(limits)
