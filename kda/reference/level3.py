"""Level 3 references: per-token gates, ``S_t = diag(exp g_t) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``.

``g`` is a natural-log decay, ``g <= 0``, either scalar per head (``[B, T, H]``, Mamba2 / GDN
style) or per channel of the key (``[B, T, H, DK]``, GLA / KDA style). Inside a chunk ``G`` is
the cumulative sum of ``g`` (reset per chunk); every weight is ``exp`` of a difference
``G_i - G_j`` with ``j <= i``, which is never positive.

Forms: ``recurrent`` (A), ``chunked`` (B), ``seq_in_grid`` (C), ``seq_in_loop`` (D), and
``intra_by_subchunks``, the intra-chunk scores computed the way a kernel can: GEMMs on
sub-chunk pairs with a reference point between them, pairwise only on the diagonal sub-chunks.
Shapes and return values are those of ``kda.reference.level1``.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, chunk_lengths, from_chunks, start_state, to_chunks


def per_channel(g: torch.Tensor, dk: int) -> torch.Tensor:
    """Scalar gates ``[B, T, H]`` as per-channel gates ``[B, T, H, DK]``."""
    return g[..., None].expand(*g.shape, dk) if g.dim() == 3 else g


# --8<-- [start:recurrent]
def recurrent(q, k, v, g, initial_state=None, output_final_state=False):
    """(A) ``S = diag(exp g_t) S + k_t v_t^T`` token by token."""
    q, k, v = as_f64(q, k, v)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    S = start_state(q, v, initial_state)
    o = torch.empty(*v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t])[..., None] * S + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, (S if output_final_state else None)
# --8<-- [end:recurrent]


# --8<-- [start:weights]
def chunk_gates(g, chunk_size):
    """``g [B, T, H, DK]`` -> chunk-local cumulative gates ``G [B, H, NC, C, DK]``. Padding
    positions get ``g = 0``, so ``G`` stays flat after a short last chunk and the chunk's
    total decay ``exp(G[..., -1, :])`` is that of its real tokens."""
    return torch.cumsum(to_chunks(g, chunk_size), dim=-2)


def pairwise_scores(Qc, Kc, G, include_diagonal=True):
    """``sum_d q_id k_jd exp(G_id - G_jd)`` for ``j <= i`` (``j < i`` without the diagonal),
    evaluated only there, so ``exp`` never sees a positive argument."""
    C = G.shape[-2]
    keep = torch.ones(C, C, dtype=torch.bool, device=G.device).tril(0 if include_diagonal else -1)
    diff = torch.where(keep[..., None], G[..., :, None, :] - G[..., None, :, :], 0.0)
    scores = torch.einsum("...id,...jd,...ijd->...ij", Qc, Kc, torch.exp(diff))
    return torch.where(keep, scores, 0.0)
# --8<-- [end:weights]


def carry_state(S, K, V, G):
    """The state after one chunk: ``diag(e^{G_last}) S + (K e^{G_last - G})^T V``, with the keys
    decayed to the chunk's end (``K``, ``V``, ``G`` are one chunk, ``[..., C, D]``)."""
    G_last = G[..., -1:, :]
    return torch.exp(G_last[..., 0, :])[..., None] * S + (K * torch.exp(G_last - G)).transpose(-1, -2) @ V


def _chunks(q, k, v, g, chunk_size):
    """Inputs as float64 chunks ``[B, H, NC, C, D]`` and the chunk-local gates ``G``."""
    q, k, v = as_f64(q, k, v)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    return (*(to_chunks(x, chunk_size) for x in (q, k, v)), chunk_gates(g, chunk_size))


# --8<-- [start:chunked]
def chunked(q, k, v, g, chunk_size=64, initial_state=None, output_final_state=False):
    """(B) Per chunk: read-out ``(Q e^G) S``, intra ``pairwise(Q, K, G) V``, then carry the state."""
    Qc, Kc, Vc, G = _chunks(q, k, v, g, chunk_size)
    S = start_state(q, v, initial_state)
    out = []
    for c in range(Qc.shape[2]):
        Q, K, V, Gc = Qc[:, :, c], Kc[:, :, c], Vc[:, :, c], G[:, :, c]
        out.append((Q * torch.exp(Gc)) @ S + pairwise_scores(Q, K, Gc) @ V)
        S = carry_state(S, K, V, Gc)
    return from_chunks(torch.stack(out, dim=2), q.shape[1]), (S if output_final_state else None)
# --8<-- [end:chunked]


def seq_in_grid(q, k, v, g, chunk_size=64, initial_state=None, output_final_state=False):
    """(C) Block ``bx`` rebuilds its prefix state from the chunks before it."""
    Qc, Kc, Vc, G = _chunks(q, k, v, g, chunk_size)
    h0 = start_state(q, v, initial_state)

    def prefix(n):
        S = h0.clone()
        for c in range(n):
            S = carry_state(S, Kc[:, :, c], Vc[:, :, c], G[:, :, c])
        return S

    out = [(Qc[:, :, bx] * torch.exp(G[:, :, bx])) @ prefix(bx)
           + pairwise_scores(Qc[:, :, bx], Kc[:, :, bx], G[:, :, bx]) @ Vc[:, :, bx] for bx in range(Qc.shape[2])]
    return from_chunks(torch.stack(out, dim=2), q.shape[1]), (prefix(Qc.shape[2]) if output_final_state else None)


def seq_in_loop(q, k, v, g, chunk_size=64, block_dv=32, initial_state=None, output_final_state=False,
                subchunk=16):
    """(D) Value stripes in the grid, chunks in a loop, intra scores by sub-chunks."""
    Qc, Kc, Vc, G = _chunks(q, k, v, g, chunk_size)
    h0 = start_state(q, v, initial_state)
    o = torch.empty(*Qc.shape[:4], Vc.shape[-1], dtype=torch.float64, device=Qc.device)
    final = torch.empty_like(h0)
    for dv0 in range(0, Vc.shape[-1], block_dv):
        dv = slice(dv0, min(dv0 + block_dv, Vc.shape[-1]))
        S = h0[..., dv].clone()
        for c in range(Qc.shape[2]):
            Q, K, V, Gc = Qc[:, :, c], Kc[:, :, c], Vc[:, :, c, :, dv], G[:, :, c]
            o[:, :, c, :, dv] = (Q * torch.exp(Gc)) @ S + intra_by_subchunks(Q, K, Gc, subchunk) @ V
            S = carry_state(S, K, V, Gc)
        final[..., dv] = S
    return from_chunks(o, q.shape[1]), (final if output_final_state else None)


# --8<-- [start:subchunks]
def intra_by_subchunks(Qc, Kc, G, subchunk=16):
    """The intra-chunk scores as a kernel computes them with per-channel gates.

    For a query sub-chunk ``I`` and an earlier key sub-chunk ``J``, the gate at the start of
    ``I`` is a reference point between every ``j`` in ``J`` and every ``i`` in ``I``:
    ``exp(G_i - G_j) = exp(G_i - G_ref) * exp(G_ref - G_j)`` with both factors <= 1, so the
    block is one GEMM of two pre-weighted operands. Diagonal sub-chunks have no such point
    and are computed pairwise, like ``pairwise_scores``.
    """
    C = G.shape[-2]
    scores = torch.zeros(*G.shape[:-2], C, C, dtype=G.dtype, device=G.device)
    for i0 in range(0, C, subchunk):
        I = slice(i0, min(i0 + subchunk, C))
        G_ref = G[..., i0 - 1:i0, :] if i0 else torch.zeros_like(G[..., :1, :])   # the state entering I
        for j0 in range(0, i0, subchunk):
            J = slice(j0, j0 + subchunk)
            q_w = Qc[..., I, :] * torch.exp(G[..., I, :] - G_ref)                 # <= 1
            k_w = Kc[..., J, :] * torch.exp(G_ref - G[..., J, :])                 # <= 1
            scores[..., I, J] = q_w @ k_w.transpose(-1, -2)
        scores[..., I, I] = pairwise_scores(Qc[..., I, :], Kc[..., I, :], G[..., I, :])
    return scores
# --8<-- [end:subchunks]


# --8<-- [start:capped_diagonal]
def capped_diagonal(X, K, G, cap, subchunk=16):
    """The diagonal sub-chunk blocks ``sum_d x_id k_jd 2^(G'_i - G'_j)`` (``j <= i``) as ``chunk_intra`` forms them
    for steep chunks with ``pairwise="capped"``: ``G`` the cumulative gate in log2 units ``[..., C, D]``, ``G'`` the
    same with every token's step ``G_t - G_(t-1)`` capped at ``-cap``, one product of ``X 2^e`` and ``(K 2^-e)^T``
    per sub-chunk with ``e = G' - G'_m`` referred to its middle row ``m``. Zero off the diagonal blocks and above
    the diagonal."""
    C = G.shape[-2]
    step = torch.diff(G, dim=-2, prepend=torch.zeros_like(G[..., :1, :])).clamp(min=-cap)
    scores = torch.zeros(*G.shape[:-2], C, C, dtype=torch.float64, device=G.device)
    for i0 in range(0, C, subchunk):
        I = slice(i0, i0 + subchunk)
        capped = torch.cumsum(step[..., I, :], dim=-2)                 # the first row's step cancels in e
        e = capped - capped[..., subchunk // 2 - 1:subchunk // 2, :]
        left, right = X[..., I, :] * torch.exp2(e), K[..., I, :] * torch.exp2(-e)
        scores[..., I, I] = torch.tril(left @ right.transpose(-1, -2))
    return scores
# --8<-- [end:capped_diagonal]


# --8<-- [start:kernel_mimic]
LOG2_E = 1.4426950408889634


def prepare(q, k, g, scale=1.0, chunk_size=64, subchunk=16):
    """What the per-channel stage (``kda.kernels.chunk_intra.chunk_intra(delta=False)``) writes, in
    float64 and chunk layout:
    ``Qw = scale Q 2^G``, ``Kw = K 2^(G_last - G)`` (zero past the real length), the state
    decay ``2^G_last`` per chunk, and ``A = scale * intra scores`` by sub-chunks, with ``G``
    the chunk-local cumsum of ``g`` in log2 units."""
    q, k = as_f64(q, k)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    Qc, Kc = to_chunks(q, chunk_size), to_chunks(k, chunk_size)
    G = chunk_gates(g * LOG2_E, chunk_size)                      # log2 units
    lengths = chunk_lengths(q.shape[1], chunk_size, G.device)
    real = (torch.arange(chunk_size, device=G.device) < lengths[:, None])[..., None]   # [NC, C, 1]
    G_last = G[..., -1:, :]
    Qw = scale * Qc * torch.exp2(G)
    Kw = torch.where(real, Kc * torch.exp2(G_last - G), 0.0)
    A = scale * intra_by_subchunks(Qc, Kc, G / LOG2_E, subchunk)   # the same numbers in base e
    return Qw, Kw, torch.exp2(G_last[..., 0, :]), A


def kernel_mimic(q, k, v, g, scale=1.0, chunk_size=64, initial_state=None, output_final_state=False):
    """The two-stage per-channel pipeline: ``prepare``, then per chunk ``O = Qw S + A V``
    and ``S = diag(decay) S + Kw^T V``."""
    Qw, Kw, decay, A = prepare(q, k, g, scale, chunk_size)
    Vc = to_chunks(v.to(torch.float64), chunk_size)
    S = start_state(q, v, initial_state)
    out = []
    for c in range(Vc.shape[2]):
        out.append(Qw[:, :, c] @ S + A[:, :, c] @ Vc[:, :, c])
        S = decay[:, :, c, :, None] * S + Kw[:, :, c].transpose(-1, -2) @ Vc[:, :, c]
    return from_chunks(torch.stack(out, dim=2), q.shape[1]), (S if output_final_state else None)
# --8<-- [end:kernel_mimic]
