"""Level 0, the mathematics: forward substitution, the WY form of the gated delta rule and the
chunk's affine map ``S' = M S + B`` with its composition (float64, CPU or GPU tensors).

The recurrence is KDA's in fla's convention, state ``S`` stored ``d_k x d_v``::

    S <- diag(exp(g_t)) S                          (per-channel gate, g_t <= 0, natural log)
    S <- S + beta_t k_t (v_t - S^T k_t)^T          (delta rule on the gated state)
    o_t = S^T q_t

GDN is the special case of a scalar gate (``g`` of shape ``[B, T, H]``). Inside a chunk,
``G_i`` is the cumulative sum of ``g`` up to and including position ``i`` (reset per chunk).
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, start_state
from kda.reference.level3 import pairwise_scores, per_channel

# --8<-- [start:forward_substitution]
def forward_substitution(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Solve ``L X = B`` for unit lower-triangular ``L [..., C, C]``, row by row:
    ``x_i = b_i - sum_{j<i} L_ij x_j``. Only the strict lower triangle of ``L`` is read."""
    X = [B[..., 0, :]]                  # rows collected, not written in place: autograd follows
    for i in range(1, L.shape[-1]):
        X.append(B[..., i, :] - (L[..., i, :i, None] * torch.stack(X, dim=-2)).sum(-2))
    return torch.stack(X, dim=-2)
# --8<-- [end:forward_substitution]


# --8<-- [start:recurrent]
def recurrent(q, k, v, g, beta, initial_state=None, output_final_state=False):
    """The gated delta rule token by token (KDA; GDN with a scalar ``g``)."""
    q, k, v, beta = as_f64(q, k, v, beta)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    S = start_state(q, v, initial_state)
    o = torch.empty(*v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t])[..., None] * S                                  # gate first
        residual = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)          # v - S^T k
        S = S + beta[:, t, :, None, None] * torch.einsum("bhk,bhv->bhkv", k[:, t], residual)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, (S if output_final_state else None)
# --8<-- [end:recurrent]


# --8<-- [start:chunk_wy]
def chunk_wy(k, v, g, beta, pairs=None):
    """One chunk (tensors ``[..., C, D]``, ``g`` already per channel, ``beta [..., C]``):
    the WY form ``beta_i * residual_i = U_i - W_i S`` for any start state ``S``.

    ``A = tril(diag(beta) (K e^G)(K e^-G)^T, -1)`` is formed entry by entry as
    ``beta_i sum_d k_id k_jd exp(G_id - G_jd)``, only for ``j < i`` (never ``exp`` of a positive
    number). ``U = (I + A)^-1 diag(beta) V`` and ``W = (I + A)^-1 diag(beta) (K e^G)``.
    ``pairs [C, C]`` (packed sequences in one chunk): the pairs ``A`` keeps, those of one sequence.
    """
    G = torch.cumsum(g, dim=-2)                                               # [..., C, DK]
    A = beta[..., :, None] * pairwise_scores(k, k, G, include_diagonal=False)
    if pairs is not None:
        A = A * pairs
    eye = torch.eye(k.shape[-2], dtype=k.dtype, device=k.device)
    U = forward_substitution(eye + A, beta[..., None] * v)
    W = forward_substitution(eye + A, beta[..., None] * k * torch.exp(G))
    return U, W, G
# --8<-- [end:chunk_wy]


# --8<-- [start:chunk_affine]
def chunk_affine(k, v, g, beta):
    """The chunk's affine map: ``S_end = M S_start + B`` with
    ``M = diag(e^{G_last}) - K_dec^T W``, ``B = K_dec^T U``, ``K_dec = K e^{G_last - G}``."""
    U, W, G = chunk_wy(k, v, g, beta)
    K_dec = k * torch.exp(G[..., -1:, :] - G)                                 # keys decayed to the end
    M = torch.diag_embed(torch.exp(G[..., -1, :])) - K_dec.transpose(-1, -2) @ W
    Bm = K_dec.transpose(-1, -2) @ U
    return M, Bm
# --8<-- [end:chunk_affine]


# --8<-- [start:compose]
def compose(first, second):
    """Apply ``first = (M0, B0)`` then ``second = (M1, B1)``: ``(M1 M0, M1 B0 + B1)``."""
    (M0, B0), (M1, B1) = first, second
    return M1 @ M0, M1 @ B0 + B1
# --8<-- [end:compose]


# --8<-- [start:chunked]
def chunked(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=False):
    """The chunkwise algorithm: per chunk, the WY form, the output, then ``S = M S + B``."""
    q, k, v, beta = as_f64(q, k, v, beta)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    B_, T, H, DK = q.shape
    heads = lambda x: x.transpose(1, 2)                                      # [B, H, T, ...]
    q, k, v, g, beta = heads(q), heads(k), heads(v), heads(g), beta.transpose(1, 2)
    S = start_state(q.transpose(1, 2), v.transpose(1, 2), initial_state)
    out = torch.empty_like(v)
    for s in range(0, T, chunk_size):
        c = slice(s, min(s + chunk_size, T))
        U, W, G = chunk_wy(k[:, :, c], v[:, :, c], g[:, :, c], beta[:, :, c])
        new = U - W @ S                                                       # beta * residuals
        scores = pairwise_scores(q[:, :, c], k[:, :, c], G)                   # j <= i, diagonal included
        out[:, :, c] = (q[:, :, c] * torch.exp(G)) @ S + scores @ new
        K_dec = k[:, :, c] * torch.exp(G[..., -1:, :] - G)
        S = torch.exp(G[..., -1, :])[..., None] * S + K_dec.transpose(-1, -2) @ new
    return out.transpose(1, 2).contiguous(), (S if output_final_state else None)
# --8<-- [end:chunked]
