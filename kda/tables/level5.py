"""Level-5 tables: what capping each token's fall costs the steep chunks' diagonal blocks."""

from __future__ import annotations

import torch

from kda.activation import Activation
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.reference import level5 as ref5
from kda.reference.level3 import LOG2_E
from kda.site.runtime import text
from kda.tables import Table, sci


def steep_gates(form: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Natural-log gates ``[B, T, H, D]`` of ``form``: a KDA layer's at initialisation (``"layer"``: ``-exp(A_log)
    softplus(x + dt_bias)``, ``A_log = log U(1, 16)``), fla's ``safe_gate`` form (``"safe_gate"``: ``-5 sigmoid(exp(A_log)
    (x + dt_bias))``, x ~ N(1, 1)), ``"uniform_to_-20"``, ``"runs_of_-20"`` (logsigmoid with tokens 40 to 109 at -20)
    or ``"logsigmoid"``."""
    B, T, H, D = shape
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    A = torch.empty(H, dtype=torch.float64).uniform_(1, 16, generator=gen)
    bias = 0.1 * torch.randn(H, D, generator=gen, dtype=torch.float64)
    if form in ("layer", "safe_gate"):                  # the layer's activations, as the op applies them
        layer = form == "layer"
        act = Activation("softplus" if layer else "sigmoid", None, A.log(), bias, -5.0)
        return act.apply(x if layer else x + 1, None)[0]
    if form == "uniform_to_-20":
        return -20 * torch.rand(shape, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(x)
    if form == "runs_of_-20":
        g[:, 40:110] = -20.0
    return g


# --8<-- [start:capped_steps_error]
def capped_steps_error(cap: float, T: int = 256, H: int = 2, D: int = 128, seed: int = 0) -> Table:
    """KDA's output, relative L2 error against the float64 recurrence on the unrounded inputs: with q, k and v
    rounded to bf16 (what every bf16 kernel reads) and the exact scores of ``kernel_mimic``, and the same with
    both score matrices' 16-row diagonal blocks formed with every token's fall capped at ``cap`` (log2;
    ``chunk_intra``'s ``pairwise="capped"``, here in every chunk); then the cap alone (capped against exact, both on
    the rounded inputs) and the share of (token, channel) steps it changes."""
    gen = torch.Generator().manual_seed(seed)
    table = Table([text(zh="门控", en="gate"), text(zh="被截断的步", en="steps capped"),
                   text(zh="bf16 输入，精确得分", en="bf16 inputs, exact scores"),
                   text(zh="bf16 输入，截断", en="bf16 inputs, capped"),
                   text(zh="截断本身", en="the cap alone")],
                  formats=[None, "{:.1%}", sci, sci, sci])
    scale = D ** -0.5
    for form in ("logsigmoid", "runs_of_-20", "uniform_to_-20", "layer", "safe_gate"):
        q = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
        k = ref4.l2_normalize(torch.randn(1, T, H, D, generator=gen, dtype=torch.float64))
        v = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
        beta = torch.rand(1, T, H, generator=gen, dtype=torch.float64)
        g = steep_gates(form, (1, T, H, D), gen)
        ref = ref0.recurrent(q * scale, k, v, g, beta)[0]
        q, k, v = (x.to(torch.bfloat16).double() for x in (q, k, v))
        exact = ref5.kernel_mimic(q, k, v, g, beta, scale)[0]
        capped = ref5.kernel_mimic(q, k, v, g, beta, scale, capped=cap)[0]
        share = (g * LOG2_E < -cap).double().mean().item()
        table.rows.append([form, share, rel_l2(exact, ref), rel_l2(capped, ref), rel_l2(capped, exact)])
    return table
# --8<-- [end:capped_steps_error]


def tile_fill(cases=((1024, 64, 96), (8192, 8, 144)), chunk_size: int = 64) -> Table:
    """Short packed sequences in tiles of whole sequences: for ``(N, longest, seed)`` (N lengths drawn uniformly
    from 1 to ``longest``), the chunks of the same tokens as one sequence against the tiles filled in order
    (``packed.tile_spans``) and by best fit, longest sequences first (``packed.best_fit_tiles``), each with the
    share of its rows that hold a token."""
    from kda import packed

    table = Table([text(zh="序列", en="sequences"), text(zh="token 数", en="tokens"),
                   text(zh="作为一条序列的块数", en="chunks as one sequence"),
                   text(zh="按顺序填的 tile", en="tiles filled in order"), text(zh="占用", en="rows used"),
                   text(zh="最佳适配的 tile", en="tiles by best fit"), text(zh="占用", en="rows used")],
                  formats=[None, None, None, None, "{:.1%}".format, None, "{:.1%}".format])
    for n, longest, seed in cases:
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, longest + 1, (n,), generator=gen)
        bounds = (0, *lengths.cumsum(0).tolist())
        tokens = bounds[-1]
        in_order, best_fit = len(packed.tile_spans(bounds, chunk_size)), len(packed.best_fit_tiles(bounds, chunk_size))
        table.rows.append([text(zh=f"{n} 条，1 到 {longest} 个 token", en=f"{n} of 1 to {longest} tokens"), tokens,
                           -(-tokens // chunk_size), in_order, tokens / (in_order * chunk_size), best_fit,
                           tokens / (best_fit * chunk_size)])
    return table
