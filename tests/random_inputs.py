"""Random inputs of the linear-attention recurrences, one generator for every test file that needs them.

``gated_delta`` draws, in this order, ``q, k`` (``HQ`` heads, keys of unit norm), ``v`` (``H`` heads), the gate,
``beta``, the initial state and the two output gradients ``do`` and ``dht``, each from the same generator, so
that a test asking for fewer tensors still gets the same first ones.
"""

import torch

from kda.reference import level4 as ref4

def runs_of_minus_20(draw, shape, strength):
    """logsigmoid gates with a long run of near-total forgetting (tokens 40 to 109 at -20 per step)."""
    g = torch.nn.functional.logsigmoid(draw(*shape))
    g[:, 40:110] = -20.0
    return g


# The gates' forms: the log decay per step, drawn by ``draw(*shape)`` (normal) or ``draw(*shape, rand=True)``
GATE_FORMS = {
    "logsigmoid": lambda draw, shape, strength: torch.nn.functional.logsigmoid(draw(*shape)),
    "uniform": lambda draw, shape, strength: -strength * draw(*shape, rand=True),
    "mild": lambda draw, shape, strength: -0.02 * draw(*shape, rand=True),
    # -2 softplus: most chunks too steep for 32-row sub-chunks, not for 16
    "kda_style": lambda draw, shape, strength: -2 * torch.nn.functional.softplus(draw(*shape)),
    "uniform_to_-20": lambda draw, shape, strength: -20 * draw(*shape, rand=True),
    "runs_of_-20": runs_of_minus_20,
}


def drawing(gen, dtype, device):
    """``draw(*shape, rand=False)``: normal (or with ``rand`` uniform) values from ``gen``."""
    return lambda *shape, rand=False: (torch.rand if rand else torch.randn)(*shape, generator=gen, dtype=dtype,
                                                                            device=device)


def gate_values(form, shape, gen, device="cpu", dtype=torch.float32, strength=1.0):
    """A gate of ``form`` (one of ``GATE_FORMS``) and ``shape``, drawn from ``gen``."""
    return GATE_FORMS[form](drawing(gen, dtype, device), shape, strength)


def gated_delta(B=2, T=70, H=2, K=8, V=5, *, HQ=None, gate="channel", form="logsigmoid", strength=1.0,
                strong=False, delta=True, beta_range=(0.0, 1.0), normalize_keys=True, dtype=torch.float64, cast=None,
                device="cpu", seed=0):
    """``(q, k, v, g, beta, h0, do, dht)``. ``gate``: ``"channel"`` (``[B, T, H, K]``), ``"head"`` (``[B, T, H]``)
    or ``"none"`` (``g`` is ``None``, nothing drawn); ``form``: one of ``GATE_FORMS`` (``"uniform"`` is
    ``-strength U(0, 1)``); ``strong``: the middle third of the tokens at -20 per step (the decay underflows within
    a chunk). Without ``delta``, ``beta`` is ``None`` and nothing is drawn for it; with it, ``beta`` is uniform in
    ``beta_range``. Everything is drawn in ``dtype`` on ``device``; ``cast``: ``q``, ``k`` and ``v`` then rounded
    to it (the kernels' inputs), the rest left as drawn."""
    gen = torch.Generator(device=device).manual_seed(seed)
    draw = drawing(gen, dtype, device)
    HQ = HQ or H
    q = draw(B, T, HQ, K)
    k = draw(B, T, HQ, K)
    k = ref4.l2_normalize(k) if normalize_keys else k
    v = draw(B, T, H, V)
    if cast is not None:
        q, k, v = q.to(cast), k.to(cast), v.to(cast)
    g = None
    if gate != "none":
        g = gate_values(form, (B, T, H, K) if gate == "channel" else (B, T, H), gen, device, dtype, strength)
        if strong:
            g[:, T // 3: 2 * T // 3] = -20.0
    lo, hi = beta_range
    beta = lo + (hi - lo) * draw(B, T, H, rand=True) if delta else None
    h0 = draw(B, H, K, V)
    do, dht = draw(B, T, H, V), draw(B, H, K, V)
    return q, k, v, g, beta, h0, do, dht
