"""Tables of the level-2 chapter (article 002), computed from the references and plain arithmetic."""

from __future__ import annotations

import math
import statistics

import torch

from kda.metrics import max_abs, rel_l2
from kda.reference import level1 as ref1
from kda.reference import level2 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

ALPHAS = (0.99, 0.95, 0.9, 0.8, 0.5)
FP16_MAX = torch.finfo(torch.float16).max          # 65504
FP32_MAX = torch.finfo(torch.float32).max
FP16_TINY = torch.finfo(torch.float16).tiny         # smallest normal, 6.10e-05
FP32_TINY = torch.finfo(torch.float32).tiny


def _inputs(B, T, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))


# --8<-- [start:agreement]
def agreement(seed: int = 0, alpha: float = 0.9, B=2, T=12, H=2, D=4, chunk_size=4) -> Table:
    """Section 4.4: every form against the recurrence, and the alpha = 1 degeneration."""
    q, k, v = _inputs(B, T, H, D, seed)
    a = ref.recurrent(q, k, v, alpha)[0]
    rows = [(text(zh="B 分块（比值形式）vs A 递推", en="B chunked (ratio form) vs A recurrent"),
             ref.chunked(q, k, v, alpha, chunk_size)[0], a),
            (text(zh="C 序列在 grid 里 vs A", en="C seq-in-grid vs A"), ref.seq_in_grid(q, k, v, alpha, chunk_size)[0], a),
            (text(zh="D 序列在循环里 vs A", en="D seq-in-loop vs A"),
             ref.seq_in_loop(q, k, v, alpha, chunk_size, block_dv=2)[0], a),
            (text(zh="B 因式分解形式 vs A", en="B factorized form vs A"),
             ref.chunked(q, k, v, alpha, chunk_size, intra="factorized")[0], a),
            (text(zh="B 取 alpha = 1 vs 第一级 A", en="B with alpha = 1 vs level-1 A"),
             ref.chunked(q, k, v, 1.0, chunk_size)[0], ref1.recurrent(q, k, v)[0])]
    table = Table([text(zh="对照", en="comparison"), text(zh="最大绝对误差", en="max abs"), "rel L2"],
                  formats=[None, sci, sci])
    for name, out, against in rows:
        table.rows.append([name, max_abs(out, against), rel_l2(out, against)])
    return table
# --8<-- [end:agreement]


# --8<-- [start:per_token]
def per_token(seed: int = 0, B=2, T=12, H=2, D=4, low=0.85, high=0.999) -> Table:
    """Section 2.2 with per-token decays ``alpha_t ~ U(low, high)``: the matrix form
    ``((Q K^T) * Gamma) V`` against the recurrence, and the range of the causal entries of Gamma."""
    q, k, v = _inputs(B, T, H, D, seed)
    g = torch.Generator().manual_seed(seed + 1)
    alpha_t = low + (high - low) * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    vector_form = ref.recurrent(q, k, v, alpha_t)[0]
    matrix_form, gamma = ref.parallel_form(q, k, v, alpha_t)
    causal = gamma[torch.ones_like(gamma, dtype=torch.bool).tril()]
    table = Table([text(zh="检验", en="check"), text(zh="值", en="value")], formats=[None, None])
    table.rows.append([text(zh="矩阵形式 vs 向量形式，rel L2", en="matrix form vs vector form, rel L2"),
                       sci(rel_l2(matrix_form, vector_form))])
    table.rows.append([text(zh="Gamma 对角线及其下方：最小值", en="Gamma on and below the diagonal: min"),
                       f"{causal.min().item():.3f}"])
    table.rows.append([text(zh="Gamma 对角线及其下方：最大值", en="Gamma on and below the diagonal: max"),
                       f"{causal.max().item():.3f}"])
    return table
# --8<-- [end:per_token]


def largest_exponent(alpha: float, limit: float) -> int:
    """The largest ``n`` with ``alpha^-n <= limit``: the factorized form is finite for
    ``C - 1 <= n``, i.e. for chunks up to ``n + 1``."""
    return math.floor(math.log(limit) / -math.log(alpha))


# --8<-- [start:overflow]
def overflow(alphas=ALPHAS) -> Table:
    """Section 3: the largest factor ``alpha^-(C-1)`` the factorized form materialises."""
    table = Table(["alpha", "alpha^-31 (C=32)", "alpha^-63 (C=64)", "alpha^-127 (C=128)",
                   text(zh="fp16：alpha^-n 仍有限的最大 n", en="fp16: largest n with alpha^-n finite"),
                   text(zh="fp32：最大 n", en="fp32: largest n")],
                  formats=[None, sci, sci, sci, None, None])
    for a in alphas:
        table.rows.append([a, a ** -31, a ** -63, a ** -127, largest_exponent(a, FP16_MAX),
                           largest_exponent(a, FP32_MAX)])
    return table
# --8<-- [end:overflow]


# --8<-- [start:fp16_single_chunk]
def fp16_single_chunk(alphas=ALPHAS, C=64, D=64, trials=20, seed=0) -> Table:
    """Section 3.1: one chunk's intra term with fp16 operands and fp32 accumulation, median
    relative L2 over ``trials`` random inputs against float64.

    Ratio form: ``S = Qh Kh^T`` (fp32), ``S * Gamma``, cast to fp16, ``@ Vh``.
    Factorized: ``(Q a^i)h (K a^-j)h^T`` (fp32), times the 0/1 mask, cast to fp16, ``@ Vh``.
    Each form rounds its own GEMM operands to fp16 once; a NaN in any trial makes the cell NaN.
    """
    i = torch.arange(C, dtype=torch.float64)
    mask = torch.ones(C, C).tril()
    table = Table(["alpha", text(zh="比值形式 rel L2", en="ratio form rel L2"),
                   text(zh="因式分解 rel L2", en="factorized rel L2"), "alpha^-(C-1)"], formats=[None, sci, sci, sci])
    for a in alphas:
        gamma = torch.where(i[:, None] >= i[None, :], a ** (i[:, None] - i[None, :]).clamp(min=0), 0.0)
        g = torch.Generator().manual_seed(seed)
        ratio, factor = [], []
        for _ in range(trials):
            q, k, v = (torch.randn(C, D, generator=g, dtype=torch.float64) for _ in range(3))
            exact = ((q @ k.T) * gamma) @ v
            vh = v.half().float()
            s = (q.half().float() @ k.half().float().T) * gamma.float()
            ratio.append(rel_l2(s.half().float() @ vh, exact))
            qa = (q * (a ** i)[:, None]).half().float()
            kb = (k * (a ** -i)[:, None]).half().float()          # inf once a^-j > 65504
            s = (qa @ kb.T) * mask                                 # inf * 0 = NaN
            factor.append(rel_l2(s.half().float() @ vh, exact))
        med = [statistics.median(x) if not any(math.isnan(e) for e in x) else float("nan") for x in (ratio, factor)]
        table.rows.append([a, med[0], med[1], a ** -(C - 1)])
    return table
# --8<-- [end:fp16_single_chunk]


def _fp_class(x: float, dtype: torch.dtype) -> str:
    y = torch.tensor(x, dtype=torch.float64).to(dtype).item()
    if y == 0.0:
        return text(zh="下溢为 0", en="underflows to 0")
    if abs(y) >= torch.finfo(dtype).tiny:
        return text(zh="正规数", en="normal")
    return text(zh="非正规数", en="subnormal")


# --8<-- [start:gamma_range]
def gamma_range(alphas=(0.99, 0.9, 0.5), C=128) -> Table:
    """Section 3.1: the causal entries of Gamma in fp32 (all in (0, 1]); the smallest is alpha^(C-1)."""
    i = torch.arange(C, dtype=torch.float64)
    table = Table(["alpha", "C", text(zh="最大值", en="max"), text(zh="最小非零值", en="smallest nonzero"),
                   text(zh="最小值的 fp32 类别", en="fp32 class of the smallest"),
                   text(zh="下溢为 0 的比例", en="share underflowed to 0")],
                  formats=[None, None, "{:.3f}", sci, None, "{:.1%}"])
    for a in alphas:
        causal = (i[:, None] - i[None, :])[torch.ones(C, C, dtype=torch.bool).tril()]
        values = (a ** causal).to(torch.float32)
        nonzero = values[values > 0]
        table.rows.append([a, C, values.max().item(), nonzero.min().item(),
                           _fp_class(nonzero.min().item(), torch.float32), (values == 0).float().mean().item()])
    return table
# --8<-- [end:gamma_range]


def fp16_underflow(alphas=ALPHAS, Cs=(64, 128)) -> Table:
    """Section 3.2: the smallest weight alpha^(C-1) if Gamma were stored in fp16."""
    columns = ["alpha"]
    for C in Cs:
        columns += [f"alpha^{C - 1} (C={C})", text(zh=f"存为 fp16 (C={C})", en=f"in fp16 (C={C})")]
    table = Table(columns, formats=[None] + [sci, None] * len(Cs))
    for a in alphas:
        row = [a]
        for C in Cs:
            row += [a ** (C - 1), _fp_class(a ** (C - 1), torch.float16)]
        table.rows.append(row)
    return table


def memory_length(alphas=(0.999, 0.99, 0.95, 0.9, 0.5), C=64, threshold=1e-3) -> Table:
    """Section 6: tokens until a contribution has decayed to ``threshold``: ``ln(threshold) / ln(alpha)``."""
    table = Table(["alpha", f"alpha^{C}", text(zh="有效记忆长度（token 数）", en="effective memory length (tokens)")],
                  formats=[None, sci, "{:.0f}"])
    for a in alphas:
        table.rows.append([a, a ** C, math.log(threshold) / math.log(a)])
    return table
