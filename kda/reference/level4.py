"""Level 4 references: the delta rule, ``S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T``,
``o_t = S_t^T q_t`` (state ``d_k x d_v``; ``b_t`` in [0, 1] per token and head).

Written as an update it is online regression on the state: ``S <- S + b k (v - S^T k)^T``
moves ``S^T k`` a fraction ``b`` of the way towards ``v``.

Forms: ``recurrent`` (A); ``chunked`` (B), the WY / UT form per chunk; and the stages a
kernel pipeline computes, each a function (``scaled_kkt``, ``invert_unit_lower`` or
``invert_unit_lower_blocked``, ``wy``, ``state_pass``, ``chunk_output``), composed in
``kernel_mimic``. Shapes as in ``kda.reference.level1``; ``beta`` is ``[B, T, H]``.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, causal_mask, from_chunks, start_state, to_chunks
from kda.reference.level0 import forward_substitution


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last dimension (fla's ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# --8<-- [start:recurrent]
def recurrent(q, k, v, beta, initial_state=None, output_final_state=False):
    """(A) Token by token: ``S <- S + b_t k_t (v_t - S^T k_t)^T``, then ``o_t = S^T q_t``."""
    q, k, v, beta = as_f64(q, k, v, beta)
    S = start_state(q, v, initial_state)
    o = torch.empty(*v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[1]):
        residual = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + beta[:, t, :, None, None] * torch.einsum("bhk,bhv->bhkv", k[:, t], residual)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, (S if output_final_state else None)
# --8<-- [end:recurrent]


# --8<-- [start:stages]
def scaled_kkt(Kc, beta_c):
    """``A = tril(diag(b) K K^T, -1)`` per chunk (``Kc [..., C, DK]``, ``beta_c [..., C]``)."""
    C = Kc.shape[-2]
    strict = torch.ones(C, C, dtype=torch.bool, device=Kc.device).tril(-1)
    return torch.where(strict, beta_c[..., :, None] * (Kc @ Kc.transpose(-1, -2)), 0.0)


def invert_unit_lower(A):
    """``(I + A)^-1`` for strictly lower ``A [..., C, C]``: level 0's forward substitution with
    the identity on the right, so row ``i`` of the inverse is ``e_i - sum_{j<i} A_ij (row j)``."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return forward_substitution(eye + A, eye.expand(A.shape))


def invert_unit_lower_blocked(A, block=16):
    """The same inverse the way a kernel builds it: the ``block x block`` diagonal blocks by
    forward substitution (independent of each other), then block forward substitution
    ``T_IJ = -T_II sum_{J <= K < I} A_IK T_KJ`` for the blocks below the diagonal, which are
    GEMMs."""
    C = A.shape[-1]
    n = C // block
    assert n * block == C, "C must be a multiple of the block size"
    Tinv = torch.zeros_like(A)
    blk = [slice(i * block, (i + 1) * block) for i in range(n)]
    for I in range(n):
        Tinv[..., blk[I], blk[I]] = invert_unit_lower(A[..., blk[I], blk[I]])
    for I in range(1, n):
        for J in range(I - 1, -1, -1):
            acc = sum(A[..., blk[I], blk[K]] @ Tinv[..., blk[K], blk[J]] for K in range(J, I))
            Tinv[..., blk[I], blk[J]] = -Tinv[..., blk[I], blk[I]] @ acc
    return Tinv


def invert_unit_lower_products(A, block=16):
    """The same inverse with the blocks below the diagonal from matrix products of the whole
    chunk (tensor-core GEMMs in a kernel) instead of block by block. With ``D`` the inverse of
    the block-diagonal part (diagonal blocks by forward substitution) and ``A_off`` the blocks
    below the diagonal, ``I + A = D^-1 (I + M)`` with ``M = D A_off``. ``M`` is zero on and above
    the block diagonal, so ``M^n = 0`` for ``n`` blocks and ``(I + M)^-1 = I - M + M^2 - ...``
    ``= (I - M)(I + M^2)(I + M^4)...``: for 4 blocks, ``(I + A)^-1 = (I - M)(I + M^2) D``."""
    C = A.shape[-1]
    n = C // block
    assert n * block == C, "C must be a multiple of the block size"
    block_of = torch.arange(C, device=A.device) // block
    on_diagonal = block_of[:, None] == block_of[None, :]
    D = torch.zeros_like(A)
    for I in range(n):
        rows = slice(I * block, (I + 1) * block)
        D[..., rows, rows] = invert_unit_lower(A[..., rows, rows])
    M = D @ torch.where(on_diagonal, 0.0, A)
    Tinv, factor = D, -M
    for _ in range((n - 1).bit_length()):       # times (I + (-M)^(2^j)), until the power is 0
        Tinv = Tinv + factor @ Tinv
        factor = factor @ factor
    return Tinv


def wy(Tinv, Kc, Vc, beta_c):
    """``W = T diag(b) K`` and ``U = T diag(b) V``: with them the chunk's corrected values
    (``b_i`` times the residuals ``v_i - S_i^T k_i``) are ``U - W S`` for the entering state ``S``."""
    return Tinv @ (beta_c[..., None] * Kc), Tinv @ (beta_c[..., None] * Vc)


def state_pass(Kc, W, U, h0):
    """Sequential over chunks: the state entering each chunk (the snapshots the output needs) and
    the corrected values ``U - W S``; then ``S <- S + K^T (U - W S)``. Returns
    ``(snapshots [B, H, NC, DK, DV], v_new [B, H, NC, C, DV], final state)``."""
    S = h0.clone()
    snapshots, v_new = [], []
    for c in range(Kc.shape[2]):
        snapshots.append(S)
        new = U[:, :, c] - W[:, :, c] @ S
        v_new.append(new)
        S = S + Kc[:, :, c].transpose(-1, -2) @ new
    return torch.stack(snapshots, dim=2), torch.stack(v_new, dim=2), S


def chunk_output(Qc, Kc, snapshots, v_new):
    """``O = Q S_enter + tril(Q K^T) (U - W S_enter)`` per chunk (every chunk independent)."""
    causal = causal_mask(Qc.shape[-2], Qc.device)
    return Qc @ snapshots + torch.where(causal, Qc @ Kc.transpose(-1, -2), 0.0) @ v_new
# --8<-- [end:stages]


def _chunks(q, k, v, beta, chunk_size):
    q, k, v, beta = as_f64(q, k, v, beta)
    beta_c = to_chunks(beta[..., None], chunk_size)[..., 0]               # padding rows: b = 0
    return (*(to_chunks(x, chunk_size) for x in (q, k, v)), beta_c)


# --8<-- [start:chunked]
def chunked(q, k, v, beta, chunk_size=64, initial_state=None, output_final_state=False):
    """(B) Per chunk: the WY form from the exact inverse, the output, then the state."""
    Qc, Kc, Vc, beta_c = _chunks(q, k, v, beta, chunk_size)
    S = start_state(q, v, initial_state)
    out = []
    for c in range(Qc.shape[2]):
        Q, K, V, b = Qc[:, :, c], Kc[:, :, c], Vc[:, :, c], beta_c[:, :, c]
        W, U = wy(invert_unit_lower(scaled_kkt(K, b)), K, V, b)
        new = U - W @ S
        out.append(chunk_output(Q, K, S, new))
        S = S + K.transpose(-1, -2) @ new
    return from_chunks(torch.stack(out, dim=2), q.shape[1]), (S if output_final_state else None)
# --8<-- [end:chunked]


# --8<-- [start:kernel_mimic]
def kernel_mimic(q, k, v, beta, scale=1.0, chunk_size=64, initial_state=None, output_final_state=False,
                 use_qk_l2norm=False, block=16):
    """The stages in the order a kernel pipeline runs them: (1) ``scaled_kkt``, (2) the blocked
    inverse, (3) ``wy``: all chunks in parallel; (4) ``state_pass``: sequential; (5)
    ``chunk_output``: all chunks in parallel again."""
    if use_qk_l2norm:
        q, k = l2_normalize(q.double()), l2_normalize(k.double())
    Qc, Kc, Vc, beta_c = _chunks(q * scale, k, v, beta, chunk_size)
    Tinv = invert_unit_lower_blocked(scaled_kkt(Kc, beta_c), block)
    W, U = wy(Tinv, Kc, Vc, beta_c)
    snapshots, v_new, final = state_pass(Kc, W, U, start_state(q, v, initial_state))
    o = chunk_output(Qc, Kc, snapshots, v_new)
    return from_chunks(o, q.shape[1]), (final if output_final_state else None)
# --8<-- [end:kernel_mimic]
