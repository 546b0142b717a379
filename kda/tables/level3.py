"""Level-3 tables: what the per-channel factorization can hold, measured with the references."""

from __future__ import annotations

import math

import torch

from kda.reference import level3 as ref
from kda.reference.common import causal_mask
from kda.site.runtime import text
from kda.tables import Table, sci

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(C, D=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(4, C, D, generator=gen, dtype=torch.float64)
    k = torch.randn(4, C, D, generator=gen, dtype=torch.float64)
    return q, k


def factorized_scores(q, k, G, dtype):
    """Intra scores by one GEMM: ``(Q e^G)(K e^-G)^T`` with both operands stored in ``dtype``
    (what a kernel keeps in shared memory) and the products summed in float64, then the
    causal mask. ``G`` is the chunk-local cumulative gate (natural log)."""
    qw = (q * torch.exp(G)).to(dtype).double()
    kw = (k * torch.exp(-G)).to(dtype).double()
    return torch.where(causal_mask(G.shape[-2], G.device), qw @ kw.transpose(-1, -2), 0.0)


def _factorized_error(g, C, dtype, q, k) -> float:
    """Relative L2 error of the factorized scores for a constant gate ``g`` per step (inf or NaN
    count as an infinite error)."""
    G = ref.chunk_gates(torch.full((1, C, 1, q.shape[-1]), g, dtype=torch.float64), C)[0, 0, 0]
    exact = ref.pairwise_scores(q, k, G)
    got = factorized_scores(q, k, G, dtype)
    if not torch.isfinite(got).all():
        return math.inf
    return ((got - exact).norm() / exact.norm()).item()


# --8<-- [start:factorization_limits]
def factorization_limits(tolerance: float = 1e-2) -> Table:
    """For each chunk size and operand dtype, the weakest constant gate ``g`` per step at which
    the single-GEMM factorization fails (inf/NaN, or a relative error above ``tolerance``),
    found by bisection on ``|g|``; and the decay ``e^g`` it corresponds to."""
    table = Table(["C", text(zh="操作数", en="operands"), text(zh="从 g = 起失效", en="fails from g ="),
                   text(zh="每步衰减 e^g", en="decay e^g per step"),
                   text(zh="该处的 key 因子 e^(C abs(g))", en="key factor e^(C abs(g)) there")],
                  formats=[None, None, "{:.3f}", "{:.3f}", sci])
    for C in (64, 32, 16):
        q, k = _inputs(C)
        for name, dtype in DTYPES.items():
            lo, hi = 1e-3, 100.0                  # fails at hi, holds at lo
            for _ in range(40):
                mid = math.sqrt(lo * hi)
                if _factorized_error(-mid, C, dtype, q, k) > tolerance:
                    hi = mid
                else:
                    lo = mid
            table.rows.append([C, name, -hi, math.exp(-hi), math.exp(C * hi)])
    return table
# --8<-- [end:factorization_limits]


def strong_gates(gates=(-0.1, -5.0, -20.0, -1e4)) -> Table:
    """The three ways to compute the intra scores of one chunk (C = 64, float64 unless stated)
    under strong constant gates, against the pairwise definition."""
    C = 64
    q, k = _inputs(C)
    table = Table([text(zh="每步 g", en="g per step"), text(zh="一个 GEMM，fp32 操作数", en="one GEMM, fp32 operands"),
                   text(zh="一个 GEMM，bf16 操作数", en="one GEMM, bf16 operands"),
                   text(zh="16 行子块，float64", en="sub-chunks of 16, float64")], formats=[None, sci, sci, sci])
    for g in gates:
        G = ref.chunk_gates(torch.full((1, C, 1, q.shape[-1]), g, dtype=torch.float64), C)[0, 0, 0]
        exact = ref.pairwise_scores(q, k, G)

        def err(got):
            if not torch.isfinite(got).all():
                return math.nan if torch.isnan(got).any() else math.inf
            return ((got - exact).norm() / exact.norm()).item()

        table.rows.append([g, err(factorized_scores(q, k, G, torch.float32)),
                           err(factorized_scores(q, k, G, torch.bfloat16)),
                           err(ref.intra_by_subchunks(q, k, G.expand_as(q), 16))])
    return table


def diagonal_path_share(span_max_log2: float, subchunk: int = 16, C: int = 64, T: int = 8192,
                        H: int = 8, D: int = 128, seed: int = 0) -> Table:
    """For gates as models draw them, the share of chunks in which some sub-chunk's gate falls by
    more than ``span_max_log2`` (log2 units) from the row before it to its last row: those
    chunks take the pairwise path for their diagonal scores."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
    lsig = torch.nn.functional.logsigmoid
    softplus = torch.nn.functional.softplus
    draws = {
        "logsigmoid(x) (GLA)": lsig(x),
        text(zh="logsigmoid(x) / 16（GLA 的门控归一化）",
             en="logsigmoid(x) / 16 (GLA's gate normaliser)"): lsig(x) / 16,
        text(zh="-2 softplus(x)（KDA 式，exp(A_log) = 2）",
             en="-2 softplus(x) (KDA-style, exp(A_log) = 2)"): -2 * softplus(x),
        "-4 softplus(x) (exp(A_log) = 4)": -4 * softplus(x),
        "-8 softplus(x) (exp(A_log) = 8)": -8 * softplus(x),
        "logsigmoid(x) * 30": lsig(x) * 30,
        text(zh="[-20, 0] 上均匀分布", en="uniform in [-20, 0]"):
            -20 * torch.rand(1, T, H, D, generator=gen, dtype=torch.float64),
    }
    table = Table([text(zh="门控", en="gate"), text(zh="g 的均值", en="mean g"),
                   text(zh="子块内的最大下降（log2）", en="largest sub-chunk fall (log2)"),
                   text(zh="走逐对路径的块", en="chunks on the pairwise path")],
                  formats=[None, "{:.3f}", "{:.1f}", "{:.1%}"])
    for name, g in draws.items():
        G = ref.chunk_gates(g / math.log(2), C)                          # [1, H, NC, C, D], log2
        before = torch.cat([torch.zeros_like(G[..., :1, :]), G[..., subchunk - 1:-1:subchunk, :]], dim=-2)
        fall = (before - G[..., subchunk - 1::subchunk, :]).amax(dim=(-1, -2))   # per chunk
        table.rows.append([name, g.mean().item(), fall.max().item(), (fall > span_max_log2).double().mean().item()])
    return table
