"""Level 2 references: ``S_t = a S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``, constant decay ``a``.

``a`` (``alpha``) is a number in (0, 1] or a tensor ``[H]`` (one constant per head, as in
RetNet). ``recurrent`` also takes a per-token ``alpha`` of shape ``[B, T, H]``.

Inside a chunk, with 0-based local positions ``i, j, r`` and real chunk length ``L``
(``L = C`` except for a shorter tail), the decay weights sit in three places:

1. the intra-chunk mask ``Gamma[i, j] = a^(i - j)`` for ``j <= i``, else 0;
2. the keys, decayed to the chunk end before they enter the state: ``a^(L - 1 - r)``;
3. the state between chunks, ``a^L``, and the queries that read it, ``a^(i + 1)``.

Every weight is <= 1. ``chunked(intra="factorized")`` writes weight 1 as
``a^i * a^(-j)`` instead, which materialises factors up to ``a^-(C-1)``: exact in float64,
but it overflows in fp16 (see ``kda.tables.level2``).

Forms: ``recurrent`` (A), ``chunked`` (B), ``seq_in_grid`` (C), ``seq_in_loop`` (D), and
``parallel_form``, the whole-sequence matrix form ``((Q K^T) * Gamma) V`` for per-token
decays. Shapes and return values are those of ``kda.reference.level1``.
"""

from __future__ import annotations

import torch

from kda.reference.common import (as_f64, causal_mask, chunk_lengths, from_chunks,
                                   start_state, to_chunks)


def alpha_per_head(alpha, H: int, device) -> torch.Tensor:
    """A float or an ``[H]`` tensor -> float64 ``[H]``."""
    a = torch.as_tensor(alpha, dtype=torch.float64, device=device)
    return a.expand(H).clone() if a.dim() == 0 else a.clone()


# --8<-- [start:recurrent]
def recurrent(q, k, v, alpha, initial_state=None, output_final_state=False):
    """(A) ``S = a S + k v^T`` token by token; ``alpha``: float, ``[H]`` or ``[B, T, H]``."""
    q, k, v = as_f64(q, k, v)
    B, T, H, _ = q.shape
    a = torch.as_tensor(alpha, dtype=torch.float64, device=q.device)
    a = a.expand(B, T, H) if a.dim() < 3 else a          # per token from here on
    S = start_state(q, v, initial_state)
    o = torch.empty(*v.shape, dtype=torch.float64, device=v.device)
    for t in range(T):
        S = a[:, t, :, None, None] * S + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, (S if output_final_state else None)
# --8<-- [end:recurrent]


# --8<-- [start:weights]
def decay_weights(a: torch.Tensor, chunk_size: int, lengths: torch.Tensor):
    """The three weight places for per-head decay ``a: [H]`` and chunk lengths ``[NC]``.

    Returns ``gamma [H, C, C]`` (intra mask), ``w_query [H, C]`` (read),
    ``w_key [H, NC, C]`` (write, decayed to each chunk's real end) and
    ``chunk_decay [H, NC]`` (state carried over one chunk).
    """
    C = chunk_size
    i = torch.arange(C, dtype=torch.float64, device=a.device)
    a = a[:, None]
    gap = (i[:, None] - i[None, :]).clamp(min=0)                 # evaluate only j <= i
    gamma = torch.where(causal_mask(C, a.device), a[..., None] ** gap, 0.0)
    w_query = a ** (i + 1)
    L = lengths.to(torch.float64)
    steps_to_end = L[:, None] - 1 - i[None, :]                    # [NC, C]
    w_key = torch.where(steps_to_end >= 0, a[..., None] ** steps_to_end.clamp(min=0), 0.0)
    chunk_decay = a ** L[None, :]
    return gamma, w_query, w_key, chunk_decay
# --8<-- [end:weights]


# --8<-- [start:chunked]
def chunked(q, k, v, alpha, chunk_size=64, initial_state=None, output_final_state=False,
            intra="ratio"):
    """(B) The chunk identity with the three weight places.

    ``intra="ratio"`` builds ``Gamma[i, j] = a^(i-j)`` (all weights <= 1, as in the GDN
    paper); ``intra="factorized"`` computes the same scores as
    ``(Q * a^i)(K * a^-j)^T`` before masking.
    """
    T, H = q.shape[1], q.shape[2]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))   # [B, H, NC, C, D]
    NC = Qc.shape[2]
    a = alpha_per_head(alpha, H, q.device)
    gamma, w_query, w_key, chunk_decay = decay_weights(a, chunk_size, chunk_lengths(T, chunk_size, q.device))

    # place 2: every chunk's contribution, decayed to the chunk's end
    contrib = torch.einsum("bhcnk,bhcnv->bhckv", Kc * w_key[None, ..., None], Vc)
    # place 3: S_prev[c] = a^L S_prev[c-1] + contrib[c-1]. A plain cumsum cannot carry
    # the factor; dividing by a^(cC) first would bring back an overflowing 1/gamma.
    prev = [start_state(q, v, initial_state)]
    for c in range(NC):
        prev.append(chunk_decay[None, :, c, None, None] * prev[-1] + contrib[:, :, c])
    final = prev[-1]
    prev = torch.stack(prev[:-1], dim=2)                               # [B, H, NC, DK, DV]

    o_inter = torch.einsum("bhcnk,bhckv->bhcnv", Qc * w_query[None, :, None, :, None], prev)
    if intra == "ratio":   # place 1: scores * Gamma
        scores = torch.einsum("bhcnk,bhcmk->bhcnm", Qc, Kc) * gamma[None, :, None]
    elif intra == "factorized":
        i = torch.arange(chunk_size, dtype=torch.float64, device=q.device)
        up = a[:, None] ** i                                            # a^i
        down = a[:, None] ** (-i)                                       # a^-j, grows to a^-(C-1)
        scores = torch.einsum("bhcnk,bhcmk->bhcnm", Qc * up[None, :, None, :, None],
                              Kc * down[None, :, None, :, None])
        scores = scores.masked_fill(~causal_mask(chunk_size, q.device), 0.0)
    else:
        raise ValueError(f"intra must be 'ratio' or 'factorized', got {intra!r}")
    o_intra = torch.einsum("bhcnm,bhcmv->bhcnv", scores, Vc)
    return from_chunks(o_inter + o_intra, T), (final if output_final_state else None)
# --8<-- [end:chunked]


# --8<-- [start:seq_in_grid]
def seq_in_grid(q, k, v, alpha, chunk_size=64, initial_state=None, output_final_state=False):
    """(C) Block ``bx`` rebuilds its prefix state: decay the state, add a decayed chunk."""
    T, H = q.shape[1], q.shape[2]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))
    NC = Qc.shape[2]
    a = alpha_per_head(alpha, H, q.device)
    gamma, w_query, w_key, chunk_decay = decay_weights(a, chunk_size, chunk_lengths(T, chunk_size, q.device))
    h0 = start_state(q, v, initial_state)
    o = torch.empty(*Qc.shape[:4], Vc.shape[-1], dtype=torch.float64, device=q.device)

    def prefix(n):   # the state after chunks 0..n-1, rebuilt from scratch
        S = h0.clone()
        for c in range(n):
            Kd = Kc[:, :, c] * w_key[None, :, c, :, None]
            S = chunk_decay[None, :, c, None, None] * S + Kd.transpose(-1, -2) @ Vc[:, :, c]
        return S

    for bx in range(NC):
        S = prefix(bx)
        Qb, Kb, Vb = Qc[:, :, bx], Kc[:, :, bx], Vc[:, :, bx]
        acc = (Qb * w_query[None, :, :, None]) @ S
        acc = acc + ((Qb @ Kb.transpose(-1, -2)) * gamma[None]) @ Vb
        o[:, :, bx] = acc
    return from_chunks(o, T), (prefix(NC) if output_final_state else None)
# --8<-- [end:seq_in_grid]


# --8<-- [start:seq_in_loop]
def seq_in_loop(q, k, v, alpha, chunk_size=64, block_dv=32, initial_state=None,
                output_final_state=False):
    """(D) Mirror of the fused decay kernel, in its order of operations.

    Per chunk: read-out ``(Q S) * a^(i+1)`` (the query weight applied to the rows of the
    product), intra ``(Q K^T * Gamma) V``, write-back, then ``S = a^L S`` and only then
    ``S += K^T (V * a^(L-1-r))`` (the key weight moved onto the value rows).
    """
    T, H = q.shape[1], q.shape[2]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))
    NC, DV = Qc.shape[2], Vc.shape[-1]
    a = alpha_per_head(alpha, H, q.device)
    gamma, w_query, w_key, chunk_decay = decay_weights(a, chunk_size, chunk_lengths(T, chunk_size, q.device))
    h0 = start_state(q, v, initial_state)
    o = torch.empty(*Qc.shape[:4], DV, dtype=torch.float64, device=q.device)
    final = torch.empty_like(h0)

    for dv0 in range(0, DV, block_dv):
        dv = slice(dv0, min(dv0 + block_dv, DV))
        S = h0[..., dv].clone()
        for c in range(NC):
            Qb, Kb, Vb = Qc[:, :, c], Kc[:, :, c], Vc[:, :, c, :, dv]
            acc = (Qb @ S) * w_query[None, :, :, None]
            acc = acc + ((Qb @ Kb.transpose(-1, -2)) * gamma[None]) @ Vb
            o[:, :, c, :, dv] = acc
            S = chunk_decay[None, :, c, None, None] * S          # decay first ...
            S = S + Kb.transpose(-1, -2) @ (Vb * w_key[None, :, c, :, None])   # ... then add
        final[..., dv] = S
    return from_chunks(o, T), (final if output_final_state else None)
# --8<-- [end:seq_in_loop]


# --8<-- [start:parallel_form]
def parallel_form(q, k, v, alpha_t):
    """Whole-sequence matrix form ``O = ((Q K^T) * Gamma) V`` for per-token ``alpha_t [B, T, H]``.

    ``Gamma[i, j] = gamma_i / gamma_j`` is evaluated in log space, only where ``j <= i``,
    so no value above 1 is ever formed. Returns ``(o, gamma)`` with ``gamma [B, H, T, T]``.
    """
    q, k, v = as_f64(q, k, v)
    T = q.shape[1]
    log_gamma = torch.cumsum(torch.log(alpha_t.to(torch.float64)), dim=1)   # [B, T, H]
    lg = log_gamma.permute(0, 2, 1)                                           # [B, H, T]
    diff = lg[..., :, None] - lg[..., None, :]                                 # log(g_i / g_j)
    mask = causal_mask(T, q.device)
    gamma = torch.where(mask, torch.exp(torch.where(mask, diff, 0.0)), 0.0)
    scores = torch.einsum("bihk,bjhk->bhij", q, k) * gamma
    o = torch.einsum("bhij,bjhv->bihv", scores, v)
    return o, gamma
# --8<-- [end:parallel_form]
