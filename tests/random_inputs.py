"""Random inputs of the linear-attention recurrences, one generator for every test file that needs them.

``gated_delta`` draws, in this order, ``q, k`` (``HQ`` heads, keys of unit norm), ``v`` (``H`` heads), the gate,
``beta``, the initial state and the two output gradients ``do`` and ``dht``, each from the same generator, so
that a test asking for fewer tensors still gets the same first ones.
"""

import torch

from kda.reference import level4 as ref4


def gated_delta(B=2, T=70, H=2, K=8, V=5, *, HQ=None, gate="channel", form="logsigmoid", strength=1.0,
                strong=False, delta=True, dtype=torch.float64, seed=0):
    """``(q, k, v, g, beta, h0, do, dht)``. ``gate``: ``"channel"`` (``[B, T, H, K]``), ``"head"`` (``[B, T, H]``)
    or ``"none"`` (``g`` is ``None``, nothing drawn); ``form``: ``logsigmoid(x)``, ``x ~ N(0, 1)``, or
    ``"uniform"``, ``-strength U(0, 1)``; ``strong``: the middle third of the tokens at -20 per step (the decay
    underflows within a chunk). Without ``delta``, ``beta`` is ``None`` and nothing is drawn for it."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda *shape, rand=False: (torch.rand if rand else torch.randn)(*shape, generator=gen, dtype=dtype)
    HQ = HQ or H
    q = draw(B, T, HQ, K)
    k = ref4.l2_normalize(draw(B, T, HQ, K))
    v = draw(B, T, H, V)
    g = None
    if gate != "none":
        shape = (B, T, H, K) if gate == "channel" else (B, T, H)
        g = torch.nn.functional.logsigmoid(draw(*shape)) if form == "logsigmoid" else -strength * draw(*shape, rand=True)
        if strong:
            g[:, T // 3: 2 * T // 3] = -20.0
    beta = draw(B, T, H, rand=True) if delta else None
    h0 = draw(B, H, K, V)
    do, dht = draw(B, T, H, V), draw(B, H, K, V)
    return q, k, v, g, beta, h0, do, dht
