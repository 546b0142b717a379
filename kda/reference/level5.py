"""Level 5 reference: the gated delta rule (KDA, GDN) in the order the kernels compute it.

The recurrence, its chunked form and the chunk affine maps are in ``kda.reference.level0``
(``recurrent``, ``chunked``, ``chunk_affine``, ``compose``). ``kernel_mimic`` here is the same
function built from the stages of ``kda.kernels.chunk_intra`` and ``kda.kernels.gated_state_pass``, in float64: ``intra`` (level 3's
``prepare`` for both score matrices, level 4's blocked inverse, ``W`` and ``U``: what
``chunk_intra`` writes), then the sequential pass with the output fused.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, from_chunks, start_state, to_chunks
from kda.reference.level3 import LOG2_E, capped_diagonal, chunk_gates, per_channel, prepare
from kda.reference.level4 import invert_unit_lower_blocked


# --8<-- [start:intra]
def intra(q, k, v, g, beta, scale=1.0, chunk_size=64, capped=None):
    """What ``kda.kernels.chunk_intra.chunk_intra`` writes, in float64 and chunk layout ``[B, H, NC, C, *]``:
    ``Qw, Kw, decay, A_qk = prepare(Q, K, g, scale)`` (level 3), then from ``Kg, _, _, A_kk =
    prepare(K, K, g)`` the inverse ``T = (I + tril(diag(b) A_kk, -1))^-1``, ``W = T diag(b) Kg`` and
    ``U = T diag(b) V``. ``capped`` (a cap in log2 units): the 16-row diagonal blocks of both score matrices
    as the steep chunks' ``pairwise="capped"`` forms them (``capped_diagonal``, in every chunk: a bound on the
    kernel, which takes them in steep chunks only)."""
    q, k, v, beta = as_f64(q, k, v, beta)
    Qw, Kw, decay, A_qk = prepare(q, k, g, scale, chunk_size)
    Kg, _, _, A_kk = prepare(k, k, g, 1.0, chunk_size)
    if capped is not None:
        G = chunk_gates(per_channel(g.to(torch.float64), k.shape[-1]) * LOG2_E, chunk_size)
        Qc, Kc = to_chunks(q, chunk_size), to_chunks(k, chunk_size)
        blocks = torch.block_diag(*[torch.ones(16, 16, dtype=torch.bool)] * (chunk_size // 16)).to(G.device)
        A_qk = torch.where(blocks, scale * capped_diagonal(Qc, Kc, G, capped), A_qk)
        A_kk = torch.where(blocks, capped_diagonal(Kc, Kc, G, capped), A_kk)
    b = to_chunks(beta[..., None], chunk_size)[..., 0]                  # padding rows: b = 0
    Tinv = invert_unit_lower_blocked(torch.tril(b[..., None] * A_kk, -1))
    W, U = Tinv @ (b[..., None] * Kg), Tinv @ (b[..., None] * to_chunks(v, chunk_size))
    return Qw, Kw, decay, A_qk, W, U
# --8<-- [end:intra]


# --8<-- [start:kernel_mimic]
def kernel_mimic(q, k, v, g, beta, scale=1.0, chunk_size=64, initial_state=None, output_final_state=False,
                 capped=None):
    """(1) ``intra``: what ``chunk_intra`` writes (``capped``: as there); (2) per chunk ``V_new = U -
    W S``, ``O = Qw S + A_qk V_new``, ``S = diag(decay) S + Kw^T V_new``."""
    q, k, v, beta = as_f64(q, k, v, beta)
    Qw, Kw, decay, A_qk, W, U = intra(q, k, v, g, beta, scale, chunk_size, capped)
    S = start_state(q, v, initial_state)
    out = []
    for c in range(W.shape[2]):
        new = U[:, :, c] - W[:, :, c] @ S
        out.append(Qw[:, :, c] @ S + A_qk[:, :, c] @ new)
        S = decay[:, :, c, :, None] * S + Kw[:, :, c].transpose(-1, -2) @ new
    return from_chunks(torch.stack(out, dim=2), q.shape[1]), (S if output_final_state else None)
# --8<-- [end:kernel_mimic]
