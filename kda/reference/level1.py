"""Level 1 references: ``S_t = S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t`` (no decay).

Four float64 forms of the same function, from the plainest to the one that copies the
control flow of a kernel line by line:

* ``recurrent``    (A) token by token, the definition itself;
* ``chunked``      (B) the chunk identity ``O_c = Q_c S_c^prev + tril(Q_c K_c^T) V_c``,
  every prefix state at once through a cumulative sum shifted right by one chunk;
* ``seq_in_grid``  (C) one "block" per chunk that recomputes its own prefix state,
  like the sequence-in-grid kernel;
* ``seq_in_loop``  (D) one "block" per value stripe of width ``block_dv`` that walks the
  chunks in order and carries the state, like the fused sequence-in-loop kernel.

All take ``q, k: [B, T, H, DK]``, ``v: [B, T, H, DV]`` (``DK != DV`` allowed, any ``T``: the
last chunk may be shorter) and return ``(o, final_state)`` with ``o: [B, T, H, DV]`` and
``final_state: [B, H, DK, DV]`` (``None`` unless ``output_final_state``). No scale is
applied to ``q`` here; the public API does that.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, causal_mask, from_chunks, start_state, to_chunks


# --8<-- [start:recurrent]
def recurrent(q, k, v, initial_state=None, output_final_state=False):
    """(A) The recurrence as written: one rank-1 update and one read-out per token."""
    q, k, v = as_f64(q, k, v)
    S = start_state(q, v, initial_state)                 # [B, H, DK, DV]
    o = torch.empty(*v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[1]):
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, (S if output_final_state else None)
# --8<-- [end:recurrent]


# --8<-- [start:chunked]
def chunked(q, k, v, chunk_size=64, initial_state=None, output_final_state=False, shift=True):
    """(B) The chunk identity, all prefix states from one cumulative sum.

    ``shift=False`` reproduces the classic mistake: the inclusive prefix sum counts each
    chunk's own ``K^T V`` twice (once in the state, once in the masked intra term).
    """
    T = q.shape[1]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))   # [B, H, NC, C, D]
    h0 = start_state(q, v, initial_state)

    per_chunk = torch.einsum("bhcnk,bhcnv->bhckv", Kc, Vc)      # each chunk's K^T V
    inclusive = torch.cumsum(per_chunk, dim=2)                   # includes chunk c itself
    if shift:   # shift right by one chunk: S_c^prev sums chunks c' < c only
        prev = torch.cat([torch.zeros_like(inclusive[:, :, :1]), inclusive[:, :, :-1]], dim=2)
    else:
        prev = inclusive
    prev = prev + h0[:, :, None]

    o_inter = torch.einsum("bhcnk,bhckv->bhcnv", Qc, prev)
    scores = torch.einsum("bhcnk,bhcmk->bhcnm", Qc, Kc)
    scores = scores.masked_fill(~causal_mask(chunk_size, q.device), 0.0)  # no softmax: zero, not -inf
    o_intra = torch.einsum("bhcnm,bhcmv->bhcnv", scores, Vc)

    o = from_chunks(o_inter + o_intra, T)
    final = h0 + inclusive[:, :, -1] if output_final_state else None
    return o, final
# --8<-- [end:chunked]


# --8<-- [start:seq_in_grid]
def seq_in_grid(q, k, v, chunk_size=64, initial_state=None, output_final_state=False):
    """(C) Mirror of the sequence-in-grid kernel: block ``bx`` rebuilds its prefix state.

    Batch and head are the other two grid axes; they stay vectorised here.
    """
    T = q.shape[1]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))
    NC = Qc.shape[2]
    h0 = start_state(q, v, initial_state)
    mask = causal_mask(chunk_size, q.device).to(torch.float64)
    o = torch.empty(*Qc.shape[:4], Vc.shape[-1], dtype=torch.float64, device=q.device)

    for bx in range(NC):                                  # grid.x
        S = h0.clone()                                    # T.clear(S_f)
        for c in range(bx):                               # T.Pipelined(bx)
            S = S + Kc[:, :, c].transpose(-1, -2) @ Vc[:, :, c]
        Qb, Kb, Vb = Qc[:, :, bx], Kc[:, :, bx], Vc[:, :, bx]
        acc = Qb @ S                                      # inter-chunk term
        acc = acc + ((Qb @ Kb.transpose(-1, -2)) * mask) @ Vb   # intra-chunk term
        o[:, :, bx] = acc

    final = None
    if output_final_state:   # a block one past the end would hold the final state
        final = h0 + torch.einsum("bhcnk,bhcnv->bhkv", Kc, Vc)
    return from_chunks(o, T), final
# --8<-- [end:seq_in_grid]


# --8<-- [start:seq_in_loop]
def seq_in_loop(q, k, v, chunk_size=64, block_dv=32, initial_state=None,
                output_final_state=False, update_first=False):
    """(D) Mirror of the fused kernel: grid over (value stripes, B*H), chunks in a loop.

    ``update_first=True`` moves the state update before the write-back, which turns the
    exclusive prefix into an inclusive one (the loop-order form of ``shift=False``).
    """
    T = q.shape[1]
    q, k, v = as_f64(q, k, v)
    Qc, Kc, Vc = (to_chunks(x, chunk_size) for x in (q, k, v))
    NC, DV = Qc.shape[2], Vc.shape[-1]
    h0 = start_state(q, v, initial_state)
    mask = causal_mask(chunk_size, q.device).to(torch.float64)
    o = torch.empty(*Qc.shape[:4], DV, dtype=torch.float64, device=q.device)
    final = torch.empty_like(h0)

    for dv0 in range(0, DV, block_dv):                    # grid.x: value stripes
        dv = slice(dv0, min(dv0 + block_dv, DV))
        S = h0[..., dv].clone()                           # loop-carried state [DK, block_dv]
        for c in range(NC):                               # T.Pipelined over chunks
            Qb, Kb, Vb = Qc[:, :, c], Kc[:, :, c], Vc[:, :, c, :, dv]
            if update_first:
                S = S + Kb.transpose(-1, -2) @ Vb
            o[:, :, c, :, dv] = Qb @ S + ((Qb @ Kb.transpose(-1, -2)) * mask) @ Vb
            if not update_first:                          # update after the write = shift
                S = S + Kb.transpose(-1, -2) @ Vb
        final[..., dv] = S
    return from_chunks(o, T), (final if output_final_state else None)
# --8<-- [end:seq_in_loop]
