"""The backward pass of the chunked form, derived by hand, in float64: levels 1 to 5.

One function covers the whole ladder. Per chunk (rows ``i``, key channels ``d``; ``G`` the
chunk-local cumsum of the natural-log gate, ``E_ijd = exp(G_id - G_jd)`` for ``j <= i``)::

    P   = tril(sum_d q_id k_jd E_ijd)                     the intra-chunk scores (q scaled)
    A   = stril(b_i sum_d k_id k_jd E_ijd),  T = (I + A)^-1
    W   = T diag(b) K e^G,  U = T diag(b) V               (without a delta rule: W = 0, U = V)
    V'  = U - W S                                          S: the state entering the chunk
    O   = (Q e^G) S + P V'
    S'  = diag(e^{G_last}) S + (K e^{G_last - G})^T V'

The backward runs in three stages, as the kernels will:

1. ``forward_states``: the state entering every chunk (what a kernel stores at chunk boundaries,
   or recomputes).
2. ``reverse_state_pass``: the gradient of the state leaving every chunk, from the last chunk to
   the first: ``dS = (Q e^G)^T dO + diag(e^{G_last}) dS' - W^T dV'`` with
   ``dV' = P^T dO + (K e^{G_last - G}) dS'``. Sequential, like the forward's state pass.
3. ``chunk_gradients``: with both states known, every chunk's gradients are independent:
   ``dq``, ``dk``, ``dv``, ``dbeta`` and ``dG``, then ``dg`` as the reverse cumsum of ``dG``
   (the decay to the chunk's end added as a prefix sum instead, so that nothing cancels).

Every decay is evaluated pairwise (``E_ijd``, never ``exp`` of a positive number), so the reference
holds for any gate, runs of ``-20`` included. The gate's gradient is then a sum of pair terms
``M_ijd = dScore_ij x_id y_jd E_ijd``: it adds to ``dG_id`` and subtracts from ``dG_jd``, that is
``x_id sum_j dScore_ij y_jd E_ijd`` to row ``i`` and ``y_jd sum_i dScore_ij x_id E_ijd`` from column
``j``: the same two sums that ``dq`` and ``dk`` need, so no pair term is ever formed.
"""

from __future__ import annotations

import torch

from kda.reference.common import from_chunks, start_state, to_chunks
from kda.reference import level0, level3
from kda.reference.level3 import chunk_gates


def _pairs(G: torch.Tensor) -> torch.Tensor:
    """``E_ijd = exp(G_id - G_jd)`` where ``j <= i``, else 0."""
    C = G.shape[-2]
    keep = torch.ones(C, C, dtype=torch.bool, device=G.device).tril()[..., None]
    return torch.where(keep, torch.exp(torch.where(keep, G[..., :, None, :] - G[..., None, :, :], 0.0)), 0.0)


# The three sums over the channels that every score and gradient of a chunk is made of, for the
# cumulative gates ``G`` of a group of chunks (the decays formed once, when the sums are made). A gate
# per head is a gate of width 1 (``G [..., C, 1]``): its decays are one number per pair and the sums
# are plain matrix products. ``kda.backward.SubChunked`` gives the same sums without a [C, C, DK] table.
class Pairwise:
    """Every decay ``E_ijd = exp(G_id - G_jd)`` formed (``j <= i``): exact for any gate."""

    def __init__(self, G):
        self.E = _pairs(G)

    def scores(self, x, y, diagonal=True):
        """``sum_d x_id y_jd E_ijd`` for ``j <= i`` (``j < i`` without the diagonal), else 0."""
        if self.E.shape[-1] == 1:
            out = (x @ y.transpose(-1, -2)) * self.E[..., 0]
        else:
            out = torch.einsum("...id,...jd,...ijd->...ij", x, y, self.E)
        return out if diagonal else out.tril(-1)

    def rows(self, s, y):
        """``sum_j s_ij y_jd E_ijd`` for a lower-triangular ``s``."""
        if self.E.shape[-1] == 1:
            return (s * self.E[..., 0]) @ y
        return torch.einsum("...ij,...jd,...ijd->...id", s, y, self.E)

    def cols(self, s, x):
        """``sum_i s_ij x_id E_ijd`` for a lower-triangular ``s``."""
        if self.E.shape[-1] == 1:
            return (s * self.E[..., 0]).transpose(-1, -2) @ x
        return torch.einsum("...ij,...id,...ijd->...jd", s, x, self.E)


# --8<-- [start:pieces]
def chunk_pieces(q, k, v, g, beta, scale, chunk_size, dtype=torch.float64, sums=Pairwise):
    """Everything of the forward that does not depend on the state, per chunk ``[B, H, NC, C, *]``
    (as ``chunk_intra`` computes it, here in float64 and with pairwise decays; ``kda.backward``
    runs it in float32 on a few chunks at a time, its ``sums`` factored by sub-chunks)."""
    B, T, H, DK = q.shape
    Q, K, V = (to_chunks(x.to(dtype), chunk_size) for x in (q * scale, k, v))
    if g is None:                                       # no gate: G = 0, of width 1
        G = torch.zeros_like(K[..., :1])
    else:                                               # [B, H, NC, C, DK], or width 1 for a gate per head
        G = chunk_gates(g.to(dtype) if g.dim() == 4 else g.to(dtype)[..., None], chunk_size)
    sums = sums(G)
    P = sums.scores(Q, K)
    p = {"Q": Q, "K": K, "V": V, "G": G, "sums": sums, "P": P,
         "Qg": Q * torch.exp(G), "Kd": K * torch.exp(G[..., -1:, :] - G), "decay": torch.exp(G[..., -1, :])}
    if beta is None:                                    # levels 1-3: no delta rule
        p.update(b=None, W=torch.zeros_like(K), U=V)
        return p
    b = to_chunks(beta.to(dtype)[..., None], chunk_size)[..., 0]              # padding rows: b = 0
    scores_kk = sums.scores(K, K, diagonal=False)
    eye = torch.eye(chunk_size, dtype=dtype, device=q.device)
    Tinv = torch.linalg.solve_triangular(eye + b[..., None] * scores_kk, eye, upper=False, unitriangular=True)
    Kg = K * torch.exp(G)
    p.update(b=b, scores_kk=scores_kk, T=Tinv, Kg=Kg, W=Tinv @ (b[..., None] * Kg), U=Tinv @ (b[..., None] * V))
    return p
# --8<-- [end:pieces]


# --8<-- [start:forward_states]
def forward_states(p, S0):
    """The state entering each chunk ``[B, H, NC, DK, DV]``, and the final state."""
    S, entering = S0, []
    for c in range(p["U"].shape[2]):
        entering.append(S)
        new = p["U"][:, :, c] - p["W"][:, :, c] @ S
        S = p["decay"][:, :, c, :, None] * S + p["Kd"][:, :, c].transpose(-1, -2) @ new
    return torch.stack(entering, dim=2), S
# --8<-- [end:forward_states]


# --8<-- [start:reverse_state_pass]
def reverse_state_pass(p, dO, dS_final):
    """The gradient of the state leaving each chunk ``[B, H, NC, DK, DV]`` (the last one is the
    gradient of the final state), and that of the initial state."""
    dS, leaving = dS_final, []
    for c in reversed(range(p["U"].shape[2])):
        leaving.append(dS)
        dnew = p["P"][:, :, c].transpose(-1, -2) @ dO[:, :, c] + p["Kd"][:, :, c] @ dS
        dS = (p["Qg"][:, :, c].transpose(-1, -2) @ dO[:, :, c] + p["decay"][:, :, c, :, None] * dS
              - p["W"][:, :, c].transpose(-1, -2) @ dnew)
    return torch.stack(leaving[::-1], dim=2), dS
# --8<-- [end:reverse_state_pass]


# --8<-- [start:chunk_gradients]
def chunk_gradients(p, S, dS, dO):
    """Every chunk at once, given the state entering it (``S``) and the gradient of the state
    leaving it (``dS``): ``dQ``, ``dK``, ``dV``, ``db`` (or ``None``) and ``dg``, the gradient of the
    gate of every token in ``G``'s width, chunk layout."""
    Q, K, V, G, Qg, Kd, sums = p["Q"], p["K"], p["V"], p["G"], p["Qg"], p["Kd"], p["sums"]
    fit = (lambda x: x.sum(-1, keepdim=True)) if G.shape[-1] == 1 else (lambda x: x)   # dG in G's width
    new = p["U"] - p["W"] @ S
    dnew = p["P"].transpose(-1, -2) @ dO + Kd @ dS
    # the output O = Qg S + P V': the state read and the scores
    dQg = dO @ S.transpose(-1, -2)
    dP = torch.tril(dO @ new.transpose(-1, -2))
    diagonal = torch.diagonal(dP, dim1=-2, dim2=-1)[..., None]             # the pairs (i, i): E_ii = 1
    rows, cols = sums.rows(dP.tril(-1), K), sums.cols(dP.tril(-1), Q)
    dQ = dQg * torch.exp(G) + rows + diagonal * K
    dK = cols + diagonal * Q
    dG = fit(dQg * Qg + Q * rows - K * cols)   # pairs (i, j < i) of P: + on row i, - on column j (i = j cancels)
    # the state update S' = diag(decay) S + Kd^T V'
    dKd = new @ dS.transpose(-1, -2)
    dK = dK + dKd * torch.exp(G[..., -1:, :] - G)
    to_end = fit(dKd * Kd)                              # through G_last - G_i: - on row i, + on the last row
    dG_last = fit((S * dS).sum(-1) * p["decay"])
    if p["b"] is None:
        dV, db = dnew, None
    else:
        b, Tinv, Kg = p["b"], p["T"], p["Kg"]
        dU, dW = dnew, -dnew @ S.transpose(-1, -2)
        dXu, dXw = Tinv.transpose(-1, -2) @ dU, Tinv.transpose(-1, -2) @ dW      # X = diag(b) V, diag(b) Kg
        dT = dU @ (b[..., None] * V).transpose(-1, -2) + dW @ (b[..., None] * Kg).transpose(-1, -2)
        dA = torch.tril(-Tinv.transpose(-1, -2) @ dT @ Tinv.transpose(-1, -2), -1)  # A = stril(diag(b) K K^T E)
        dV = b[..., None] * dXu
        dKg = b[..., None] * dXw
        db = (dXu * V).sum(-1) + (dXw * Kg).sum(-1) + (dA * p["scores_kk"]).sum(-1)
        dAb = dA * b[..., None]
        rows, cols = sums.rows(dAb, K), sums.cols(dAb, K)
        dK = dK + dKg * torch.exp(G) + rows + cols
        dG = dG + fit(dKg * Kg + K * rows - K * cols)   # the pair terms of A
    dG[..., -1, :] += dG_last
    return dQ, dK, dV, db, gate_from_rows(dG, to_end, dim=-2)
# --8<-- [end:chunk_gradients]


# --8<-- [start:gate_from_rows]
def gate_from_rows(dG, to_end, dim=-2):
    """The gradient of every gate ``g_i`` of a chunk whose rows run along ``dim``, from the gradients
    ``dG`` of the cumulative gates (every term but the keys' decay to the chunk's end) and those terms
    ``to_end`` (``- to_end_m`` on ``G_m``, ``+ to_end_m`` on ``G_last``): ``G_m = sum_{i <= m} g_i``, so
    ``dg_i = sum_{m >= i} dG_m``, and ``to_end``'s share of it is ``sum_{m < i} to_end_m``, added as such,
    so that no two large terms cancel where the true gradient is small (strong gates)."""
    n = to_end.shape[dim]
    before = torch.cat([torch.zeros_like(to_end.narrow(dim, 0, 1)), to_end.cumsum(dim).narrow(dim, 0, n - 1)], dim)
    return dG.flip(dim).cumsum(dim).flip(dim) + before
# --8<-- [end:gate_from_rows]


# --8<-- [start:chunked_backward]
def chunked_backward(q, k, v, g, beta, do, dht=None, scale=1.0, chunk_size=64, initial_state=None):
    """Gradients of ``sum(o * do) + sum(S_final * dht)`` for the chunked gated delta rule (one
    sequence per batch row): ``dq, dk, dv, dg, dbeta, dh0``. ``g``: ``[B, T, H]``, ``[B, T, H, DK]``
    or ``None`` (no gate); ``beta``: ``[B, T, H]``, or ``None`` for gated linear attention
    (levels 1-3). ``dg`` and ``dbeta`` are ``None`` where the input is."""
    B, T, H, DK = q.shape
    S0 = start_state(q, v, initial_state)
    if T == 0:                                          # nothing happens: the final state is the initial one
        zeros = lambda x: torch.zeros_like(x, dtype=torch.float64) if x is not None else None
        dh0 = dht.to(torch.float64) if dht is not None else torch.zeros_like(S0)
        return zeros(q), zeros(k), zeros(v), zeros(g), zeros(beta), dh0
    p = chunk_pieces(q, k, v, g, beta, scale, chunk_size)
    S, final = forward_states(p, S0)
    dO = to_chunks(do.to(torch.float64), chunk_size)
    dS_final = dht.to(torch.float64) if dht is not None else torch.zeros_like(final)
    dS, dh0 = reverse_state_pass(p, dO, dS_final)
    dQ, dK, dV, db, dg = chunk_gradients(p, S, dS, dO)
    if g is not None:
        dg = from_chunks(dg, T)
        dg = dg if g.dim() == 4 else dg[..., 0]
    else:
        dg = None
    dbeta = from_chunks(db[..., None], T)[..., 0] if db is not None else None
    return from_chunks(dQ, T) * scale, from_chunks(dK, T), from_chunks(dV, T), dg, dbeta, dh0
# --8<-- [end:chunked_backward]


def recurrence_backward(q, k, v, g, beta, do, dht=None, scale=1.0, initial_state=None):
    """What ``chunked_backward`` must equal: the same gradients (same arguments, same results) by
    autograd through the token recurrence of the level, ``kda.reference.level0.recurrent`` with a
    delta rule, ``kda.reference.level3.recurrent`` without."""
    leaves = [x.detach().to(torch.float64).requires_grad_() if x is not None else None
              for x in (q, k, v, g, beta, initial_state)]
    q_, k_, v_, g_, beta_, h0_ = leaves
    gate = g_ if g_ is not None else torch.zeros(q.shape[:3], dtype=torch.float64, device=q.device)
    if beta_ is None:
        o, S = level3.recurrent(q_ * scale, k_, v_, gate, h0_, True)
    else:
        o, S = level0.recurrent(q_ * scale, k_, v_, gate, beta_, h0_, True)
    loss = (o * do.to(torch.float64)).sum() + ((S * dht.to(torch.float64)).sum() if dht is not None else 0.0)
    wanted = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad(loss, wanted))
    return tuple(next(grads) if x is not None else None for x in leaves)


def packed_backward(q, k, v, g, beta, do, cu_seqlens, dht=None, scale=1.0, chunk_size=64, initial_state=None):
    """``chunked_backward`` for sequences packed along ``T`` of a batch of one: each sequence on its
    own, with its own initial state and final-state gradient (``[N, H, DK, DV]``)."""
    bounds = cu_seqlens.tolist()
    parts = []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        pick = lambda x: x[:, s:e] if x is not None else None
        parts.append(chunked_backward(pick(q), pick(k), pick(v), pick(g), pick(beta), pick(do),
                                      dht[n:n + 1] if dht is not None else None, scale, chunk_size,
                                      initial_state[n:n + 1] if initial_state is not None else None))
    cat = lambda i, dim: torch.cat([part[i] for part in parts], dim=dim) if parts[0][i] is not None else None
    return cat(0, 1), cat(1, 1), cat(2, 1), cat(3, 1), cat(4, 1), cat(5, 0)


# --8<-- [start:reverse_walk]
def scalar_gate_reverse_walk(q, k, v, g, beta, do, dht=None, scale=1.0, chunk_size=64, initial_state=None):
    """GDN's backward (one gate per head, ``g [B, T, H]``) as one walk over the chunks from the last, each chunk's
    state gradient and all its gradients made together from the state entering it and the gradient of the one
    leaving it: what a fused reverse kernel computes, with the forward's inverse ``T = (I + A)^-1`` and the
    states entering the chunks as its inputs. Same arguments and results as ``chunked_backward``.

    With one gate per head every decay is a number per pair, ``D_ij = exp(G_i - G_j)`` (``j <= i``), so each sum
    of ``chunk_gradients`` is a matrix product, and three identities leave fewer of them: ``W S`` and ``U`` meet
    as ``V' = T X`` with ``X = diag(b) (V - diag(e^G) K S)``; the gradients of ``V'`` reach both ``U`` and ``W``
    through ``Y = T^T dV'`` (``dV = diag(b) Y``, ``dW = -Y S^T``); and the gradient of ``A``, ``-stril(T^T dT
    T^T)`` with ``dT = dV' X^T``, is ``-stril(Y V'^T)``, since ``T X = V'``. ``b``'s gradient through ``T`` and
    ``X`` is ``sum_v Y_iv (V - e^G K S)_iv + sum_j dA_ij N_ij`` (``N = stril(K K^T * D)``), and the gate's is made
    of row sums of products the walk already has."""
    B, T, H, DK = q.shape
    C = chunk_size
    S = start_state(q, v, initial_state)
    if T == 0:
        return chunked_backward(q, k, v, g, beta, do, dht, scale, chunk_size, initial_state)
    Q, K, V, dO = (to_chunks(x.to(torch.float64), C) for x in (q * scale, k, v, do))    # [B, H, NC, C, D]
    G = chunk_gates(g.to(torch.float64)[..., None], C)[..., 0]                       # [B, H, NC, C]
    b = to_chunks(beta.to(torch.float64)[..., None], C)[..., 0]
    row = torch.arange(C, device=q.device)
    incl, strict = row[:, None] >= row[None, :], row[:, None] > row[None, :]
    D = torch.where(incl, torch.exp(torch.where(incl, G[..., :, None] - G[..., None, :], 0.0)), 0.0)
    E, R, decay = torch.exp(G), torch.exp(G[..., -1:] - G), torch.exp(G[..., -1])
    N = (K @ K.transpose(-1, -2)) * D * strict
    eye = torch.eye(C, dtype=torch.float64, device=q.device)
    Tinv = torch.linalg.solve_triangular(eye + b[..., None] * N, eye, upper=False, unitriangular=True)
    entering = []                                           # what the forward stores at chunk boundaries
    for c in range(Q.shape[2]):
        entering.append(S)
        X = b[:, :, c, :, None] * (V[:, :, c] - E[:, :, c, :, None] * (K[:, :, c] @ S))
        S = decay[:, :, c, None, None] * S + (R[:, :, c, :, None] * K[:, :, c]).transpose(-1, -2) @ (Tinv[:, :, c] @ X)
    dS = dht.to(torch.float64) if dht is not None else torch.zeros_like(S)
    grads = {name: torch.zeros_like(x) for name, x in (("dQ", Q), ("dK", K), ("dV", V))}
    db, dg = torch.zeros_like(b), torch.zeros_like(G)
    for c in reversed(range(Q.shape[2])):
        S = entering[c]
        Qc, Kc, Vc, dOc, Tc, Dc, Nc = (x[:, :, c] for x in (Q, K, V, dO, Tinv, D, N))
        Ec, Rc, bc = (x[:, :, c, :, None] for x in (E, R, b))
        P = (Qc @ Kc.transpose(-1, -2)) * Dc
        KS = Kc @ S
        Xraw = Vc - Ec * KS
        new = Tc @ (bc * Xraw)                              # V'
        dnew = P.transpose(-1, -2) @ dOc + (Rc * Kc) @ dS
        Y = Tc.transpose(-1, -2) @ dnew
        dP = (dOc @ new.transpose(-1, -2)) * incl
        dQg = dOc @ S.transpose(-1, -2)
        dKd = new @ dS.transpose(-1, -2)
        YS = Y @ S.transpose(-1, -2)
        dA = -(Y @ new.transpose(-1, -2)) * strict
        dAb = dA * bc
        grads["dQ"][:, :, c] = Ec * dQg + (dP * Dc) @ Kc
        grads["dK"][:, :, c] = ((dP * Dc).transpose(-1, -2) @ Qc + Rc * dKd - bc * Ec * YS + (dAb * Dc) @ Kc
                                + (dAb * Dc).transpose(-1, -2) @ Kc)
        grads["dV"][:, :, c] = bc * Y
        db[:, :, c] = (Y * Xraw).sum(-1) + (dA * Nc).sum(-1)
        PP, AN = dP * P * strict, dAb * Nc
        dG = (Ec[..., 0] * (dQg * Qc).sum(-1) + PP.sum(-1) - PP.sum(-2) - (bc * Ec)[..., 0] * (Y * KS).sum(-1)
              + AN.sum(-1) - AN.sum(-2))
        dG[..., -1] += decay[:, :, c] * (S * dS).sum((-1, -2))
        dg[:, :, c] = gate_from_rows(dG, Rc[..., 0] * (dKd * Kc).sum(-1), dim=-1)
        dS = decay[:, :, c, None, None] * dS + (Ec * Qc).transpose(-1, -2) @ dOc - (bc * Ec * Kc).transpose(-1, -2) @ Y
    chunks = lambda x: from_chunks(x, T)
    return (chunks(grads["dQ"]) * scale, chunks(grads["dK"]), chunks(grads["dV"]), chunks(dg[..., None])[..., 0],
            chunks(db[..., None])[..., 0], dS)
# --8<-- [end:reverse_walk]
