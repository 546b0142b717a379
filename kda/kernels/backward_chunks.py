"""The chunk-parallel stage of the backward (``kda.reference.backward.chunk_gradients``) as TileLang
kernels: every chunk's gradients at once, given the state entering it and the gradient of the state
leaving it (the two sequential passes, ``kda.kernels.backward_states``). For a gate per head (GDN) one
kernel, ``chunk_gradients``, described here; for a gate per channel (KDA) three, at the end of the file
(``chunk_pair_pieces``, ``chunk_state_gradients``, ``chunk_pair_gradients``), because the pairs' decays
differ per channel and go by sub-chunks.

One block per (chunk, head, batch row) recomputes what the forward made of the chunk and never
stored: the cumulative gate, ``A = stril(diag(b) K K^T E)`` with ``E_ij = 2^(G_i - G_j)``, the inverse
``T = (I + A)^-1`` (level 4's solve, the same macros as the forward), ``W``, ``U``, ``V' = U - W S`` and
the scores ``P = scale (Q K^T) E``; then, as the reference's ``chunk_gradients`` orders them:

* the state read: ``dQg = dO S^T``;
* the state update: ``dV' = P^T dO + Kd dS``, ``dKd = V' dS^T``;
* the scores: ``dP = tril(dO V'^T)``, its share of ``dQ`` and ``dK`` by ``(dP E) K`` and ``(dP E)^T Q``;
* the WY form: ``dW = -dV' S^T``, ``dXu = T^T dV'``, ``dXw = T^T dW``, ``dT = dV' Xu^T + dW Xw^T`` and
  ``dA = -stril(T^T dT T^T)``, whose pairs give ``dK`` by ``(dA b E) K`` and ``(dA b E)^T K``.

The gate's gradient is left to the caller per row, before its reverse sum within the chunk: ``dG``
(every term but the decay to the chunk's end and the state's own) and ``to_end`` (that decay's
terms, which enter as an exclusive prefix sum, ``kda.reference.backward.chunk_gradients``). With a
gate per head every pair term of the gate is a number per pair, so ``dG`` comes from row and column
sums of ``dP P`` and ``dA b (K K^T E)`` (reductions of register tiles), not from more GEMMs.

``S`` and ``dS`` share one shared buffer, loaded three times (``S``, ``dS``, ``S``), so that the
block fits the 227 KB of an H100/H200 SM. Dense batches; ``kda.backward`` lays packed sequences out
from chunk boundaries, the rows between them zeros with a zero gate and ``b = 0`` (they add nothing
to a real row). Not yet run on a GPU: ``kda.backward`` calls it only with its switch
``CHUNK_KERNEL`` on.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch

from kda import launch
from kda.chunking import CHUNK_SIZE
from kda.kernels.halvings import halvings, upper_half_end
from kda.kernels.stages import (ACCUM, decay_factor, invert_diagonal_blocks_by_columns, load_beta_checked,
                                log2_cumsum_by_columns, merge_by_substitution)
from kda.kernels.chunk_intra import token_decays

SOLVE_BLOCK = 16       # the inverse's diagonal blocks, as in the forward


@T.macro
def column_sums_out(X_s, out_s, C):
    """``out_j -= sum_i X_ij``: a pair term of the gate enters its column's gradient with the sign
    opposite to its row's. One thread per column, so that a warp reads consecutive words of a row
    (the row sums come from a register tile's reduction instead)."""
    for j in T.Parallel(C):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for i in T.serial(C):
            acc += X_s[i, j]
        out_s[j] = out_s[j] - acc


@T.macro
def new_values(Tb_s, X_s, v_s, S_in, state_s, KD_f, VD_f, Y_s, bb, bh, c):
    """The forward's ``V' = U - W S`` into ``Y_s``, from ``T diag(b)`` (``Tb_s``) and ``K 2^G`` (``X_s``):
    ``W = Tb K 2^G``, ``U = Tb V``; ``X_s`` is left holding ``-W`` and ``state_s`` the chunk's ``S``."""
    T.gemm(Tb_s, X_s, KD_f, clear_accum=True)                         # W
    T.gemm(Tb_s, v_s, VD_f, clear_accum=True)                         # U
    for i, d in T.Parallel(X_s.shape[0], X_s.shape[1]):
        X_s[i, d] = -KD_f[i, d]
    T.copy(S_in[bb, bh, c, :, :], state_s)
    T.gemm(X_s, state_s, VD_f)                                        # U - W S
    T.copy(VD_f, Y_s)


# --8<-- [start:chunk_gradients]
def chunk_gradients(DK, DV, chunk_size=64, dtype="bfloat16", scalar_gate=True, delta_rule=True, threads=256,
                    grad_dtype=ACCUM, pieces_in=False, identities=False):
    """Arguments at run time: ``Q, K [B, T, H, DK]``, ``V, dO [B, T, H, DV]`` (dtype; ``Q`` and ``K``
    with one head per value head), ``g [B, T, H, 1]`` (the gate per token, natural log), ``beta [B, T,
    H]`` (float32), ``S_in, dS_out [B, H, NC, DK, DV]`` (dtype: the state entering each chunk and the
    gradient of the one leaving it), ``scale``; then the outputs, float32: ``dQ, dK [B, T, H, DK]``,
    ``dV [B, T, H, DV]``, ``db, dG, to_end [B, T, H]``, and ``flags [2]`` (int32; the value checks of
    ``g`` and ``beta``, as the forward's, which the caller may ignore: the forward checked them).
    ``delta_rule=False``: levels 1-3 (``g`` zero for level 1, ``log a`` for level 2): no WY form, ``V' = V``
    and ``dV = dV'``; ``beta`` is not read and ``db`` not written (the caller passes buffers of their shape).
    ``grad_dtype``: that of ``dQ, dK, dV`` (each written once, from float32 registers: the inputs' dtype spares
    the caller a rounding copy of each). ``pieces_in`` (with the delta rule; ``kda.backward``'s
    ``INVERSE_FROM_FORWARD``): three more inputs after ``dS_out``, as the forward's ``chunk_intra`` compiled with
    ``backward_outputs`` writes them, ``Tinv [B, T, H, C]`` (dtype), ``KKE [B, T, H, C]`` (float32) and ``P [B,
    T, H, C]`` (dtype, its ``A_qk``): no GEMM of ``K K^T`` or ``Q K^T``, no solve. ``identities`` (with the delta
    rule; ``kda.backward.WALK_IDENTITIES``): the WY form's products by the identities of
    ``kda.reference.backward.scalar_gate_reverse_walk``, ``V' = T X`` with ``X = diag(b) (V - 2^G K S)``, ``Y = T^T
    dV'`` for both ``dV`` and ``dW``, ``dA = -stril(Y V'^T)``: 15 GEMMs a chunk instead of 20."""
    assert scalar_gate, "a gate per channel takes kda.backward's torch stages"
    assert delta_rule or not identities, "identities: the delta rule's"
    assert delta_rule or not pieces_in, "the forward's pieces are the delta rule's"
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)
    out = (lambda x: x) if grad_dtype == ACCUM else (lambda x: T.Cast(grad_dtype, x))

    @T.macro
    def body(Q, K, V, dO, g, beta, S_in, dS_out, scale, dQ, dK, dV, db, dG, to_end, flags, Tinv_in, KKE_in, P_in):
        with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
            t0 = c * C
            L = T.min(C, S - t0)
            q_s = T.alloc_shared([C, DK], dtype)          # q; later Xw = b K 2^G
            k_s = T.alloc_shared([C, DK], dtype)
            v_s = T.alloc_shared([C, DV], dtype)
            do_s = T.alloc_shared([C, DV], dtype)
            state_s = T.alloc_shared([DK, DV], dtype)     # S, then dS, then S again
            X_s = T.alloc_shared([C, DK], dtype)          # K 2^G, -W, Kd, dW
            Y_s = T.alloc_shared([C, DV], dtype)          # V', later Xu = b V
            Z_s = T.alloc_shared([C, DV], dtype)          # dV'
            A_s = T.alloc_shared([C, C], ACCUM)           # A = stril(diag(b) K K^T E), for the inverse
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            KKE_s = T.alloc_shared([C, C], ACCUM)         # stril(K K^T E)
            Cc_s = T.alloc_shared([C, C], dtype)          # T diag(b); dP E; dT, T^T dT; dA b E
            Cc2_s = T.alloc_shared([C, C], dtype)         # P, then T
            G_s = T.alloc_shared([C, 1], ACCUM)           # the cumulative gate, log2
            b_s = T.alloc_shared([C], ACCUM)
            dg_s = T.alloc_shared([C], ACCUM)
            db_s = T.alloc_shared([C], ACCUM)
            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            CC_f = T.alloc_fragment([C, C], ACCUM)
            KD_f = T.alloc_fragment([C, DK], ACCUM)
            VD_f = T.alloc_fragment([C, DV], ACCUM)
            dQ_f = T.alloc_fragment([C, DK], ACCUM)
            dK_f = T.alloc_fragment([C, DK], ACCUM)
            row_f = T.alloc_fragment([C], ACCUM)

            T.copy(Q[bb, t0:t0 + C, bh, :], q_s)
            T.copy(K[bb, t0:t0 + C, bh, :], k_s)
            T.copy(V[bb, t0:t0 + C, bh, :], v_s)
            T.copy(dO[bb, t0:t0 + C, bh, :], do_s)
            # the rows past a tail chunk's end as zeros, whatever the loads left there: a row of q or dO
            # there would reach the real rows through the column sums of the scores' pair terms. Selected in place,
            # which gives each step of these loops a block barrier (tilelang 0.1.15; 16 a chunk): written only where
            # needed instead, the kernel passed its GPU tests (run 140) but, at 255 registers, spilled 4 bytes
            for i, d in T.Parallel(C, DK):
                q_s[i, d] = T.if_then_else(i < L, q_s[i, d], 0.0)
                k_s[i, d] = T.if_then_else(i < L, k_s[i, d], 0.0)
            for i, d in T.Parallel(C, DV):
                v_s[i, d] = T.if_then_else(i < L, v_s[i, d], 0.0)
                do_s[i, d] = T.if_then_else(i < L, do_s[i, d], 0.0)
            T.copy(g[bb, t0:t0 + C, bh, :], G_s)
            log2_cumsum_by_columns(G_s, G_s, L, C, 1, flags)
            decay = lambda i, j: decay_factor(G_s[i, 0] - G_s[j, 0])      # 2^(G_i - G_j), clamped at 1
            G_last = G_s[C - 1, 0]

            if delta_rule:
                # the forward's chunk form: A, T, W (into X_s, negated), U (in VD_f), then V' = U - W S
                load_beta_checked(beta, b_s, flags, t0, L, C, bb, bh)
                if pieces_in:                              # T and K K^T E as the forward made them
                    for i, j in T.Parallel(C, C):
                        KKE_s[i, j] = T.if_then_else(i < L, KKE_in[bb, t0 + T.min(i, L - 1), bh, j], 0.0)
                        Tinv_s[i, j] = T.if_then_else(i < L, T.Cast(ACCUM, Tinv_in[bb, t0 + T.min(i, L - 1), bh, j]), 0.0)
                else:
                    T.gemm(k_s, k_s, CC_f, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(C, C):
                        kke = T.if_then_else(j < i, CC_f[i, j] * decay(i, j), 0.0)
                        KKE_s[i, j] = kke
                        A_s[i, j] = kke * b_s[i]
                    invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)
                    merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)
                if identities:                             # V' = T X, X = diag(b) (V - 2^G K S) (in Z_s)
                    for i, j in T.Parallel(C, C):              # blocks above the diagonal were not written
                        Cc_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j], 0.0)
                    T.copy(S_in[bb, bh, c, :, :], state_s)
                    T.gemm(k_s, state_s, VD_f, clear_accum=True)
                    for i, d in T.Parallel(C, DV):
                        Z_s[i, d] = b_s[i] * (v_s[i, d] - T.exp2(G_s[i, 0]) * VD_f[i, d])
                    T.gemm(Cc_s, Z_s, VD_f, clear_accum=True)
                    T.copy(VD_f, Y_s)
                else:
                    # stages.wy_tail's products, written here so that U stays in registers for U - W S (through
                    # wy_tail's buffers, bf16 at 128 x 128 spilled 8 bytes)
                    for i, j in T.Parallel(C, C):                  # blocks above the diagonal were not written
                        Cc_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j] * b_s[j],
                                                    0.0)
                    for i, d in T.Parallel(C, DK):
                        X_s[i, d] = k_s[i, d] * T.exp2(G_s[i, 0])
                    new_values(Cc_s, X_s, v_s, S_in, state_s, KD_f, VD_f, Y_s, bb, bh, c)
            else:                                          # no delta rule: V' = V
                T.copy(S_in[bb, bh, c, :, :], state_s)
                T.copy(v_s, Y_s)

            # the state read: dQ = dQg 2^G, and the gate's share sum_d dQg Qg
            T.gemm(do_s, state_s, KD_f, transpose_B=True, clear_accum=True)   # dO S^T
            for i, d in T.Parallel(C, DK):
                dQ_f[i, d] = KD_f[i, d] * T.exp2(G_s[i, 0])
                KD_f[i, d] = KD_f[i, d] * q_s[i, d]
            T.reduce_sum(KD_f, row_f, dim=1)
            for i in T.Parallel(C):
                dg_s[i] = row_f[i] * T.exp2(G_s[i, 0]) * scale

            # the scores P (kept in Cc2_s for dV'; T is made again after), and their gradient
            # dP = tril(dO V'^T): dQ += (dP E) K, then dQ is done; dK = scale (dP E)^T q; the gate's pair
            # terms sum_j dP_ij P_ij (j < i) by rows minus columns
            if pieces_in:                                  # the forward's A_qk: scale in, masked
                for i, j in T.Parallel(C, C):
                    Cc2_s[i, j] = T.if_then_else(i < L, P_in[bb, t0 + T.min(i, L - 1), bh, j], 0.0)
            else:
                T.gemm(q_s, k_s, CC_f, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    Cc2_s[i, j] = T.if_then_else(j <= i, CC_f[i, j] * scale * decay(i, j), 0.0)
            T.gemm(do_s, Y_s, CC_f, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                Cc_s[i, j] = T.if_then_else(j <= i, CC_f[i, j] * decay(i, j), 0.0)
                CC_f[i, j] = T.if_then_else(j < i, CC_f[i, j] * Cc2_s[i, j], 0.0)
            T.reduce_sum(CC_f, row_f, dim=1)
            for i in T.Parallel(C):
                dg_s[i] = dg_s[i] + row_f[i]
            T.copy(CC_f, A_s)
            column_sums_out(A_s, dg_s, C)
            T.gemm(Cc_s, k_s, dQ_f)
            for i, d in T.Parallel(C, DK):
                if i < L:
                    dQ[bb, t0 + i, bh, d] = out(dQ_f[i, d] * scale)
            T.gemm(Cc_s, q_s, dK_f, transpose_A=True, clear_accum=True)
            for i, d in T.Parallel(C, DK):
                dK_f[i, d] = dK_f[i, d] * scale

            # the state update: dV' = P^T dO + Kd dS, dKd = V' dS^T (dK += dKd 2^(G_last - G))
            T.copy(dS_out[bb, bh, c, :, :], state_s)
            for i, d in T.Parallel(C, DK):
                X_s[i, d] = k_s[i, d] * T.exp2(G_last - G_s[i, 0])
            T.gemm(Cc2_s, do_s, VD_f, transpose_A=True, clear_accum=True)
            T.gemm(X_s, state_s, VD_f)
            T.copy(VD_f, Z_s)
            T.gemm(Y_s, state_s, KD_f, transpose_B=True, clear_accum=True)
            for i, d in T.Parallel(C, DK):
                KD_f[i, d] = KD_f[i, d] * T.exp2(G_last - G_s[i, 0])
                dK_f[i, d] = dK_f[i, d] + KD_f[i, d]
                KD_f[i, d] = KD_f[i, d] * k_s[i, d]                       # dKd Kd
            T.reduce_sum(KD_f, row_f, dim=1)
            for i in T.Parallel(C):
                if i < L:
                    to_end[bb, t0 + i, bh] = row_f[i]

            if identities:
                # Y = T^T dV': dV = b Y, and sum_v Y V for db
                for i, j in T.Parallel(C, C):
                    Cc2_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j], 0.0)
                T.gemm(Cc2_s, Z_s, VD_f, transpose_A=True, clear_accum=True)
                T.copy(VD_f, Z_s)                              # Y, as the operand of Y S^T and Y V'^T
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(VD_f[i, d] * b_s[i])
                    VD_f[i, d] = VD_f[i, d] * v_s[i, d]
                T.reduce_sum(VD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = row_f[i]
                # dX_w = -Y S^T: dK += b 2^G dX_w; sum_d dX_w K_g for db, b times it for the gate
                T.copy(S_in[bb, bh, c, :, :], state_s)
                T.gemm(Z_s, state_s, KD_f, transpose_B=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    dK_f[i, d] = dK_f[i, d] - KD_f[i, d] * b_s[i] * T.exp2(G_s[i, 0])
                    KD_f[i, d] = KD_f[i, d] * k_s[i, d]
                T.reduce_sum(KD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    share = -row_f[i] * T.exp2(G_s[i, 0])
                    db_s[i] = db_s[i] + share
                    dg_s[i] = dg_s[i] + share * b_s[i]
                # dA = -stril(Y V'^T), since T X = V'
                T.gemm(Z_s, Y_s, CC_f, transpose_B=True, clear_accum=True)
            elif delta_rule:
                # dW = -dV' S^T
                T.copy(S_in[bb, bh, c, :, :], state_s)
                T.gemm(Z_s, state_s, KD_f, transpose_B=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    X_s[i, d] = -KD_f[i, d]

                # the WY form: dXu = T^T dV' (dV = b dXu), dXw = T^T dW (dK += b dXw 2^G)
                for i, j in T.Parallel(C, C):
                    Cc2_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j], 0.0)
                T.gemm(Cc2_s, Z_s, VD_f, transpose_A=True, clear_accum=True)
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(VD_f[i, d] * b_s[i])
                    VD_f[i, d] = VD_f[i, d] * v_s[i, d]
                T.reduce_sum(VD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = row_f[i]
                T.gemm(Cc2_s, X_s, KD_f, transpose_A=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    dK_f[i, d] = dK_f[i, d] + KD_f[i, d] * b_s[i] * T.exp2(G_s[i, 0])
                    KD_f[i, d] = KD_f[i, d] * k_s[i, d]
                T.reduce_sum(KD_f, row_f, dim=1)
                for i in T.Parallel(C):                       # sum_d dXw Kg: db, and b times it for the gate
                    share = row_f[i] * T.exp2(G_s[i, 0])
                    db_s[i] = db_s[i] + share
                    dg_s[i] = dg_s[i] + share * b_s[i]
                for i, d in T.Parallel(C, DV):
                    Y_s[i, d] = v_s[i, d] * b_s[i]                            # Xu
                for i, d in T.Parallel(C, DK):
                    q_s[i, d] = k_s[i, d] * T.exp2(G_s[i, 0]) * b_s[i]         # Xw
                T.gemm(Z_s, Y_s, CC_f, transpose_B=True, clear_accum=True)    # dT = dV' Xu^T
                T.gemm(X_s, q_s, CC_f, transpose_B=True)                      #    + dW Xw^T
                T.copy(CC_f, Cc_s)
                T.gemm(Cc2_s, Cc_s, CC_f, transpose_A=True, clear_accum=True)  # T^T dT
                T.copy(CC_f, Cc_s)
                T.gemm(Cc_s, Cc2_s, CC_f, transpose_B=True, clear_accum=True)  # (T^T dT) T^T
            if delta_rule:
                # dA = -stril(CC_f); D = dA (K K^T E): db += its row sums; the gate, b_i times them minus the columns'
                # sum_m b_m D_mi
                for i, j in T.Parallel(C, C):
                    dA = T.if_then_else(j < i, -CC_f[i, j], 0.0)
                    Cc_s[i, j] = dA * b_s[i] * decay(i, j)
                    CC_f[i, j] = dA * KKE_s[i, j]
                T.reduce_sum(CC_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = db_s[i] + row_f[i]
                    dg_s[i] = dg_s[i] + row_f[i] * b_s[i]
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = CC_f[i, j] * b_s[i]
                column_sums_out(A_s, dg_s, C)
                T.gemm(Cc_s, k_s, dK_f)
                T.gemm(Cc_s, k_s, dK_f, transpose_A=True)
            else:                                          # no delta rule: dV = dV'
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(Z_s[i, d])

            for i, d in T.Parallel(C, DK):
                if i < L:
                    dK[bb, t0 + i, bh, d] = out(dK_f[i, d])
            for i in T.Parallel(C):
                if i < L:
                    dG[bb, t0 + i, bh] = dg_s[i]
            if delta_rule:
                for i in T.Parallel(C):
                    if i < L:
                        db[bb, t0 + i, bh] = db_s[i]

    if pieces_in:
        @T.prim_func
        def with_forward_pieces(
            Q: T.Tensor([B, S, H, DK], dtype),
            K: T.Tensor([B, S, H, DK], dtype),
            V: T.Tensor([B, S, H, DV], dtype),
            dO: T.Tensor([B, S, H, DV], dtype),
            g: T.Tensor([B, S, H, 1], ACCUM),
            beta: T.Tensor([B, S, H], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], dtype),
            dS_out: T.Tensor([B, H, NC, DK, DV], dtype),
            Tinv_in: T.Tensor([B, S, H, C], dtype),
            KKE_in: T.Tensor([B, S, H, C], ACCUM),
            P_in: T.Tensor([B, S, H, C], dtype),
            scale: T.float32,
            dQ: T.Tensor([B, S, H, DK], grad_dtype),
            dK: T.Tensor([B, S, H, DK], grad_dtype),
            dV: T.Tensor([B, S, H, DV], grad_dtype),
            db: T.Tensor([B, S, H], ACCUM),
            dG: T.Tensor([B, S, H], ACCUM),
            to_end: T.Tensor([B, S, H], ACCUM),
            flags: T.Tensor([2], "int32"),
        ):
            body(Q, K, V, dO, g, beta, S_in, dS_out, scale, dQ, dK, dV, db, dG, to_end, flags, Tinv_in, KKE_in, P_in)

        return with_forward_pieces

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        dO: T.Tensor([B, S, H, DV], dtype),
        g: T.Tensor([B, S, H, 1], ACCUM),
        beta: T.Tensor([B, S, H], ACCUM),
        S_in: T.Tensor([B, H, NC, DK, DV], dtype),
        dS_out: T.Tensor([B, H, NC, DK, DV], dtype),
        scale: T.float32,
        dQ: T.Tensor([B, S, H, DK], grad_dtype),
        dK: T.Tensor([B, S, H, DK], grad_dtype),
        dV: T.Tensor([B, S, H, DV], grad_dtype),
        db: T.Tensor([B, S, H], ACCUM),
        dG: T.Tensor([B, S, H], ACCUM),
        to_end: T.Tensor([B, S, H], ACCUM),
        flags: T.Tensor([2], "int32"),
    ):
        body(Q, K, V, dO, g, beta, S_in, dS_out, scale, dQ, dK, dV, db, dG, to_end, flags, None, None, None)

    return main


# Subnormals flushed to zero, as in the forward's chunk_intra: one ex2.approx.ftz per exp2
chunk_gradients.compile_flags = ("-ftz=true",)
# --8<-- [end:chunk_gradients]


# --- a gate per channel (KDA): the chunk stage in three kernels -------------------------------------------
# With a gate per channel the decay of a pair, 2^(G_id - G_jd), differs per channel, so the pair sums are
# no longer row and column sums of one C x C matrix: they go by sub-chunks of SUB_CHUNK rows, as
# ``kda.backward.SubChunked`` does. Pairs in different sub-chunks factor through one reference row
# (both factors <= 1) into GEMMs; pairs inside a sub-chunk are summed one by one.

SUB_CHUNK = 16


@T.macro
def pair_rows(s_s, y_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s=None):
    """``R_id = sum_{j < i} s_ij y_jd 2^(G_id - G_jd)`` (``s_s`` zero on and above its diagonal): for the
    rows of sub-chunk ``r`` (first row ``r0``), the columns before it by a GEMM of ``s`` with
    ``y_j 2^(G_r0 - G_j)`` scaled by ``2^(G_i - G_r0)``; the columns inside it pair by pair, or with the token
    decays ``A_s`` (``token_decays``) from ``j = i - 1`` down, the pair's decay a running product (no exponential
    per pair; every factor ``<= 1``)."""
    DK = y_s.shape[1]
    for i, d in T.Parallel(C, DK):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        if A_s is None:
            for jj in T.serial(sub):
                j = (i // sub) * sub + jj
                acc += T.if_then_else(j < i, T.Cast(ACCUM, s_s[i, j]) * T.Cast(ACCUM, y_s[j, d])
                                      * decay_factor(G_s[i, d] - G_s[j, d]), 0.0)
        else:
            f = T.alloc_var(ACCUM)
            f = 1.0
            for r in T.unroll(sub):                   # j from the sub-chunk's last row down
                j = (i // sub) * sub + sub - 1 - r
                f = T.if_then_else(j < i, f * A_s[T.min(j + 1, C - 1), d], 1.0)
                acc += T.if_then_else(j < i, T.Cast(ACCUM, s_s[i, j]) * T.Cast(ACCUM, y_s[j, d]) * f, 0.0)
        R_f[i, d] = acc
    for r in range(1, C // sub):
        r0 = r * sub
        for j, d in T.Parallel(C, DK):
            Y_s[j, d] = T.if_then_else(j < r0, y_s[j, d] * decay_factor(G_s[r0, d] - G_s[j, d]), 0.0)
        T.gemm(s_s, Y_s, tmp_f, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            if i >= r0 and i < r0 + sub:
                R_f[i, d] = R_f[i, d] + tmp_f[i, d] * decay_factor(G_s[i, d] - G_s[r0, d])


@T.macro
def pair_cols(s_s, x_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s=None):
    """``R_jd = sum_{i > j} s_ij x_id 2^(G_id - G_jd)``: for the columns of sub-chunk ``b`` (last row
    ``e``), the rows after it by a GEMM of ``s^T`` with ``x_i 2^(G_i - G_e)`` scaled by ``2^(G_e - G_j)``;
    the rows inside it pair by pair, or with the token decays ``A_s`` from ``i = j + 1`` up (as ``pair_rows``)."""
    DK = x_s.shape[1]
    for j, d in T.Parallel(C, DK):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        if A_s is None:
            for ii in T.serial(sub):
                i = (j // sub) * sub + ii
                acc += T.if_then_else(i > j, T.Cast(ACCUM, s_s[i, j]) * T.Cast(ACCUM, x_s[i, d])
                                      * decay_factor(G_s[i, d] - G_s[j, d]), 0.0)
        else:
            f = T.alloc_var(ACCUM)
            f = 1.0
            for ii in T.unroll(sub):                  # i from the sub-chunk's first row up
                i = (j // sub) * sub + ii
                f = T.if_then_else(i > j, f * A_s[i, d], 1.0)
                acc += T.if_then_else(i > j, T.Cast(ACCUM, s_s[i, j]) * T.Cast(ACCUM, x_s[i, d]) * f, 0.0)
        R_f[j, d] = acc
    for b in range(C // sub - 1):
        e = b * sub + sub - 1
        for i, d in T.Parallel(C, DK):
            Y_s[i, d] = T.if_then_else(i > e, x_s[i, d] * decay_factor(G_s[i, d] - G_s[e, d]), 0.0)
        T.gemm(s_s, Y_s, tmp_f, transpose_A=True, clear_accum=True)
        for j, d in T.Parallel(C, DK):
            if j >= e + 1 - sub and j <= e:
                R_f[j, d] = R_f[j, d] + tmp_f[j, d] * decay_factor(G_s[e, d] - G_s[j, d])


@T.macro
def shared_pair_rows(s1_s, s2_s, y_s, G_s, Y_s, R1_f, tmp_f, dK_f, dG_f, C, sub, A_s=None, across=True):
    """``pair_rows`` of two pair matrices against one ``y`` (``K``), each pair's decay and each reference
    row's ``Y`` made once for both: ``R1 = rows(s1, y)`` into ``R1_f``; ``R2 = rows(s2, y)`` added to ``dK_f``
    and, times ``y`` (it is ``K``), to ``dG_f`` as it comes (no tile of its own). ``A_s``: the pairs inside a
    sub-chunk by running products of the token decays, as ``pair_rows``. ``across=False``: the pairs inside the
    sub-chunks only (``halved_pair_sums`` adds the others)."""
    DK = y_s.shape[1]
    for i, d in T.Parallel(C, DK):
        acc1 = T.alloc_var(ACCUM)
        acc2 = T.alloc_var(ACCUM)
        acc1 = 0.0
        acc2 = 0.0
        if A_s is None:
            for jj in T.serial(sub):
                j = (i // sub) * sub + jj
                w = T.if_then_else(j < i, T.Cast(ACCUM, y_s[j, d]) * decay_factor(G_s[i, d] - G_s[j, d]), 0.0)
                acc1 += T.Cast(ACCUM, s1_s[i, j]) * w
                acc2 += T.Cast(ACCUM, s2_s[i, j]) * w
        else:
            f = T.alloc_var(ACCUM)
            f = 1.0
            for r in T.unroll(sub):                   # j from the sub-chunk's last row down
                j = (i // sub) * sub + sub - 1 - r
                f = T.if_then_else(j < i, f * A_s[T.min(j + 1, C - 1), d], 1.0)
                w = T.if_then_else(j < i, T.Cast(ACCUM, y_s[j, d]) * f, 0.0)
                acc1 += T.Cast(ACCUM, s1_s[i, j]) * w
                acc2 += T.Cast(ACCUM, s2_s[i, j]) * w
        R1_f[i, d] = acc1
        dK_f[i, d] = dK_f[i, d] + acc2
        dG_f[i, d] = dG_f[i, d] + T.Cast(ACCUM, y_s[i, d]) * acc2
    for r in range(1, C // sub if across else 1):
        r0 = r * sub
        for j, d in T.Parallel(C, DK):
            Y_s[j, d] = T.if_then_else(j < r0, y_s[j, d] * decay_factor(G_s[r0, d] - G_s[j, d]), 0.0)
        T.gemm(s1_s, Y_s, tmp_f, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            if i >= r0 and i < r0 + sub:
                R1_f[i, d] = R1_f[i, d] + tmp_f[i, d] * decay_factor(G_s[i, d] - G_s[r0, d])
        T.gemm(s2_s, Y_s, tmp_f, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            if i >= r0 and i < r0 + sub:
                part = T.alloc_var(ACCUM)
                part = tmp_f[i, d] * decay_factor(G_s[i, d] - G_s[r0, d])
                dK_f[i, d] = dK_f[i, d] + part
                dG_f[i, d] = dG_f[i, d] + T.Cast(ACCUM, y_s[i, d]) * part


@T.macro
def summed_pair_cols(s1_s, x1_s, s2_s, x2_s, G_s, Y1_s, Y2_s, R_f, tmp_f, scale, C, sub, A_s=None, across=True):
    """``R = scale cols(s1, x1) + cols(s2, x2)`` in one sum: the two go to the same places (``dK`` and,
    times ``-k``, the gate), so each pair's decay is made once, and for each reference row one accumulator
    takes both GEMMs and one scaling. ``A_s``: the pairs inside a sub-chunk by running products, as ``pair_cols``.
    ``across=False``: the pairs inside the sub-chunks only."""
    DK = x1_s.shape[1]
    for j, d in T.Parallel(C, DK):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        if A_s is None:
            for ii in T.serial(sub):
                i = (j // sub) * sub + ii
                acc += T.if_then_else(i > j, (scale * T.Cast(ACCUM, s1_s[i, j]) * T.Cast(ACCUM, x1_s[i, d])
                                              + T.Cast(ACCUM, s2_s[i, j]) * T.Cast(ACCUM, x2_s[i, d]))
                                      * decay_factor(G_s[i, d] - G_s[j, d]), 0.0)
        else:
            f = T.alloc_var(ACCUM)
            f = 1.0
            for ii in T.unroll(sub):                  # i from the sub-chunk's first row up
                i = (j // sub) * sub + ii
                f = T.if_then_else(i > j, f * A_s[i, d], 1.0)
                acc += T.if_then_else(i > j, (scale * T.Cast(ACCUM, s1_s[i, j]) * T.Cast(ACCUM, x1_s[i, d])
                                              + T.Cast(ACCUM, s2_s[i, j]) * T.Cast(ACCUM, x2_s[i, d])) * f, 0.0)
        R_f[j, d] = acc
    for b in range(C // sub - 1 if across else 0):
        e = b * sub + sub - 1
        for i, d in T.Parallel(C, DK):
            Y1_s[i, d] = T.if_then_else(i > e, scale * x1_s[i, d] * decay_factor(G_s[i, d] - G_s[e, d]), 0.0)
            Y2_s[i, d] = T.if_then_else(i > e, x2_s[i, d] * decay_factor(G_s[i, d] - G_s[e, d]), 0.0)
        T.gemm(s1_s, Y1_s, tmp_f, transpose_A=True, clear_accum=True)
        T.gemm(s2_s, Y2_s, tmp_f, transpose_A=True)
        for j, d in T.Parallel(C, DK):
            if j >= e + 1 - sub and j <= e:
                R_f[j, d] = R_f[j, d] + tmp_f[j, d] * decay_factor(G_s[e, d] - G_s[j, d])


# --8<-- [start:halved_pair_sums]
@T.macro
def halved_pair_sums(dP_s, dA_s, q_s, k_s, G_s, F_s, Y1_s, Y2_s, R_f, tmp_f, dK_f, dG_f, scale, C, sub):
    """The pair sums of ``shared_pair_rows`` and ``summed_pair_cols`` over the pairs of different sub-chunks (of
    ``sub`` rows), added to ``R_f`` (``rows(dP, K)``), ``dK_f`` and ``dG_f``, by halvings: for blocks of ``2h``
    rows (``h = C / 2, C / 4, .., sub``), the pairs with ``i`` in a block's lower half and ``j`` in its upper half
    factor through the upper half's last row ``b`` as ``2^(G_i - G_b) 2^(G_b - G_j)``, both ``<= 1`` (exact for
    any gate: a factor that underflows stands for a smaller product), so each halving is four GEMMs of the pair
    matrices with rows scaled to ``b``. Every pair of different sub-chunks falls in exactly one halving. Before
    the halving of ``h``, ``dP_s`` and ``dA_s`` keep only the pairs inside blocks of ``2h`` rows (zeroed in place,
    coarse to fine: the caller is done with the pairs across blocks). ``F_s [C, *]`` (float32): each row's factor
    to ``b``, one exponential per element and halving for the four GEMMs' scalings."""
    DK = k_s.shape[1]
    for h in halvings(C, sub):                                  # a Python tuple: each halving its own code
        if h < C // 2:
            for i, j in T.Parallel(C, C):
                if i // (2 * h) != j // (2 * h):
                    dP_s[i, j] = 0.0
                    dA_s[i, j] = 0.0
        b = lambda x: upper_half_end(x, h)
        for i, d in T.Parallel(C, DK):                          # 2^(G_i - G_b) below b, 2^(G_b - G_i) up to it
            e = G_s[i, d] - G_s[b(i), d]
            F_s[i, d] = decay_factor(T.if_then_else(i > b(i), e, -e))
        # rows: sum over j in the upper half of s_ij k_j 2^(G_b - G_j), then times 2^(G_i - G_b) on the lower half
        for j, d in T.Parallel(C, DK):
            Y1_s[j, d] = T.if_then_else(j <= b(j), k_s[j, d] * F_s[j, d], 0.0)
        T.gemm(dP_s, Y1_s, tmp_f, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            if i > b(i):
                R_f[i, d] = R_f[i, d] + tmp_f[i, d] * F_s[i, d]
        T.gemm(dA_s, Y1_s, tmp_f, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            if i > b(i):
                part = T.alloc_var(ACCUM)
                part = tmp_f[i, d] * F_s[i, d]
                dK_f[i, d] = dK_f[i, d] + part
                dG_f[i, d] = dG_f[i, d] + T.Cast(ACCUM, k_s[i, d]) * part
        # columns: sum over i in the lower half of s_ij (scale q_i, k_i) 2^(G_i - G_b), times 2^(G_b - G_j) on the upper
        for i, d in T.Parallel(C, DK):
            down = T.if_then_else(i > b(i), F_s[i, d], 0.0)
            Y1_s[i, d] = scale * q_s[i, d] * down
            Y2_s[i, d] = k_s[i, d] * down
        T.gemm(dP_s, Y1_s, tmp_f, transpose_A=True, clear_accum=True)
        T.gemm(dA_s, Y2_s, tmp_f, transpose_A=True)
        for j, d in T.Parallel(C, DK):
            if j <= b(j):
                part = T.alloc_var(ACCUM)
                part = tmp_f[j, d] * F_s[j, d]
                dK_f[j, d] = dK_f[j, d] + part
                dG_f[j, d] = dG_f[j, d] - T.Cast(ACCUM, k_s[j, d]) * part
# --8<-- [end:halved_pair_sums]


@T.macro
def load_channels(src, dst_s, bb, t0, bh, L, C, d0, BD):
    """``dst_s`` = rows ``t0 ..`` of the channels ``d0 .. d0 + BD`` of ``src [B, T, H, D]``, the rows past ``L`` zero
    whatever the load left (written, not selected in place, which would give each step of the loop a block barrier:
    tilelang 0.1.15)."""
    T.copy(src[bb, t0:t0 + C, bh, d0:d0 + BD], dst_s)
    for i, d in T.Parallel(C, BD):
        if i >= L:
            dst_s[i, d] = 0.0


@T.macro
def load_rows(src, dst_s, bb, t0, bh, L, C, D):
    """``load_channels`` of all ``D`` channels."""
    load_channels(src, dst_s, bb, t0, bh, L, C, 0, D)


# --8<-- [start:chunk_pair_gradients]
def chunk_pair_gradients(DK, chunk_size=64, dtype="bfloat16", delta_rule=True, threads=256, shared_pairs=False,
                         min_blocks=1, finish_gate=False, block_dk=None, products=False, halve_to=None):
    """The pair sums of the chunk stage for a gate per channel. Arguments at run time: ``Q, K [B, T, H,
    DK]`` (dtype), ``G [B, H, NC C, DK]`` (float32, log2: each chunk's cumulative gate, flat past the
    end), ``dPs, dAb [B, T, H, C]`` (dtype: ``stril(dP)`` and ``dA b`` from ``chunk_state_gradients``),
    ``scale``; then ``dQ, dK, dG [B, T, H, DK]`` (float32), which it reads and writes: ``dQ <- scale (dQ +
    rows(dPs, K))``, ``dK += cols(dPs, scale Q) + rows(dAb, K) + cols(dAb, K)``, ``dG +=`` the pair terms
    of the gate (``Q rows - K cols`` of each). One block per (chunk, head, batch row). ``delta_rule=False``
    (level 3): ``dAb`` is not read and its sums are left out. ``shared_pairs`` (with the delta rule): the two
    row sums against ``K`` share each pair's decay and each reference row's scaled ``K``, and the two column
    sums are one sum (``shared_pair_rows``, ``summed_pair_cols``), about half the exponentials and loads of
    the pairs inside a sub-chunk; ``min_blocks``: blocks per SM (registers capped to fit them).
    ``finish_gate``: two more inputs after ``dG``, ``to_end [B, T, H, DK]`` (from ``chunk_state_gradients``)
    and ``dG_last [B, H, NC, DK]`` (each chunk decay's term), both float32, and ``dG`` leaves as the gate's
    gradient itself (``kda.backward.gate_gradient`` in the kernel: ``dG_last`` on the chunk's last row, the
    reverse sum over the chunk, ``to_end`` as an exclusive prefix sum), one thread per channel.
    ``block_dk``: channels per block (a divisor of ``DK``; ``None``: all). Every sum is per channel, only
    ``dPs`` and ``dAb`` are shared by the channels, so a block of ``block_dk`` channels is independent of
    the others: ``DK / block_dk`` blocks per chunk and head, each reading the chunk's two pair matrices,
    with smaller tiles and so more blocks per SM (fla's intra-chunk backward splits its channels so).
    ``products``: the pairs inside a sub-chunk with each pair's decay a running product of the token decays
    (``token_decays``: one exponential per token and channel instead of one per pair and channel; the loops
    unrolled), exact for any gate as before (``kda.backward``'s ``PAIR_SUMS_BY_PRODUCTS``).
    ``halve_to`` (with ``shared_pairs``; ``kda.backward``'s ``PAIR_SUMS_BY_HALVINGS``): sub-chunks of ``halve_to``
    rows (a power of two), the pairs inside them one by one and all the others by ``halved_pair_sums``."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, sub = chunk_size, halve_to or SUB_CHUNK
    assert halve_to is None or (shared_pairs and delta_rule and not products and C % halve_to == 0
                                and halve_to & (halve_to - 1) == 0), "halve_to: a power of two, with shared_pairs"
    across = halve_to is None                             # the pairs of different sub-chunks by reference rows
    NC = T.ceildiv(S, C)
    BK = block_dk or DK                                   # channels of one block
    NK = DK // BK
    assert NK * BK == DK, "block_dk divides DK"

    @T.macro
    def finished_gate(dG, to_end, dG_last, dG_f, rows_s, bb, bh, c, t0, L, d0):
        """The gate's gradient of the chunk from its rows (what ``dG`` holds plus this kernel's terms), as
        ``kda.backward.gate_gradient`` makes it: one thread per channel walks the rows from the last."""
        for i, d in T.Parallel(C, BK):
            rows_s[i, d] = T.if_then_else(i < L, dG[bb, t0 + T.min(i, L - 1), bh, d0 + d] + dG_f[i, d], 0.0)
        for d in T.Parallel(BK):
            suffix = T.alloc_var(ACCUM)
            prefix = T.alloc_var(ACCUM)
            suffix = dG_last[bb, bh, c, d0 + d]           # on the chunk's last row (past L: a zero row)
            for r in T.serial(C):
                suffix = suffix + rows_s[C - 1 - r, d]
                rows_s[C - 1 - r, d] = suffix             # sum over the rows from this one on
            prefix = 0.0
            for i in T.serial(C):
                if i < L:
                    dG[bb, t0 + i, bh, d0 + d] = rows_s[i, d] + prefix
                    prefix = prefix + to_end[bb, t0 + i, bh, d0 + d]   # to_end before this row, exclusive

    @T.macro
    def body(Q, K, G, dPs, dAb, scale, dQ, dK, dG, to_end, dG_last):
        with T.Kernel(NC, H * NK, B, threads=threads) as (c, hk, bb):
            # head and first channel of the block (one block of all the channels: the head itself)
            bh, d0 = (hk // NK, (hk % NK) * BK) if NK > 1 else (hk, 0)
            t0 = c * C
            L = T.min(C, S - t0)
            q_s = T.alloc_shared([C, BK], dtype)
            k_s = T.alloc_shared([C, BK], dtype)
            Y_s = T.alloc_shared([C, BK], dtype)          # the other side of a GEMM, scaled to its reference row
            G_s = T.alloc_shared([C, BK], ACCUM)          # with finish_gate, at the end: the gate's rows
            dP_s = T.alloc_shared([C, C], dtype)
            dA_s = T.alloc_shared([C, C], dtype)
            R_f = T.alloc_fragment([C, BK], ACCUM)
            tmp_f = T.alloc_fragment([C, BK], ACCUM)
            dK_f = T.alloc_fragment([C, BK], ACCUM)
            dG_f = T.alloc_fragment([C, BK], ACCUM)

            if min_blocks > 1:                                # registers capped so that this many fit an SM
                T.annotate_min_blocks_per_sm(min_blocks)
            if NK > 1:
                load_channels(Q, q_s, bb, t0, bh, L, C, d0, BK)
                load_channels(K, k_s, bb, t0, bh, L, C, d0, BK)
            else:
                load_rows(Q, q_s, bb, t0, bh, L, C, DK)
                load_rows(K, k_s, bb, t0, bh, L, C, DK)
            load_rows(dPs, dP_s, bb, t0, bh, L, C, C)
            if delta_rule:
                load_rows(dAb, dA_s, bb, t0, bh, L, C, C)
            if NK > 1:
                T.copy(G[bb, bh, t0:t0 + C, d0:d0 + BK], G_s)
            else:
                T.copy(G[bb, bh, t0:t0 + C, :], G_s)
            A_s = None
            if products:                                  # each token's decay, once for every pair sum below
                A_s = T.alloc_shared([C, BK], ACCUM)
                token_decays(G_s, A_s, C, sub)

            if shared_pairs and delta_rule:
                # cols first: scale cols(dP, Q) + cols(dA b, K) sets dK, and -K times it the gate
                Y2_s = T.alloc_shared([C, BK], dtype)
                summed_pair_cols(dP_s, q_s, dA_s, k_s, G_s, Y_s, Y2_s, R_f, tmp_f, scale, C, sub, A_s, across)
                for i, d in T.Parallel(C, BK):
                    dK_f[i, d] = R_f[i, d]
                    dG_f[i, d] = -k_s[i, d] * R_f[i, d]
                # then rows(dP, K) into R (dQ, Q R on the gate) and rows(dA b, K) into dK and K R on the gate
                shared_pair_rows(dP_s, dA_s, k_s, G_s, Y_s, R_f, tmp_f, dK_f, dG_f, C, sub, A_s, across)
                if not across:
                    F_s = T.alloc_shared([C, BK], ACCUM)
                    halved_pair_sums(dP_s, dA_s, q_s, k_s, G_s, F_s, Y_s, Y2_s, R_f, tmp_f, dK_f, dG_f, scale, C, sub)
                for i, d in T.Parallel(C, BK):
                    dG_f[i, d] = dG_f[i, d] + scale * q_s[i, d] * R_f[i, d]
                    if i < L:
                        dQ[bb, t0 + i, bh, d0 + d] = scale * (dQ[bb, t0 + i, bh, d0 + d] + R_f[i, d])
                        dK[bb, t0 + i, bh, d0 + d] = dK[bb, t0 + i, bh, d0 + d] + dK_f[i, d]
                        if not finish_gate:
                            dG[bb, t0 + i, bh, d0 + d] = dG[bb, t0 + i, bh, d0 + d] + dG_f[i, d]
            else:
                pair_rows(dP_s, k_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s)       # rows(dP, K): dQ, and Q R on the gate
                for i, d in T.Parallel(C, BK):
                    if i < L:
                        dQ[bb, t0 + i, bh, d0 + d] = scale * (dQ[bb, t0 + i, bh, d0 + d] + R_f[i, d])
                    dG_f[i, d] = scale * q_s[i, d] * R_f[i, d]
                pair_cols(dP_s, q_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s)       # cols(dP, Q): dK, and -K R
                for i, d in T.Parallel(C, BK):
                    dK_f[i, d] = scale * R_f[i, d]
                    dG_f[i, d] = dG_f[i, d] - scale * k_s[i, d] * R_f[i, d]
                if delta_rule:
                    pair_rows(dA_s, k_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s)   # rows(dA b, K)
                    for i, d in T.Parallel(C, BK):
                        dK_f[i, d] = dK_f[i, d] + R_f[i, d]
                        dG_f[i, d] = dG_f[i, d] + k_s[i, d] * R_f[i, d]
                    pair_cols(dA_s, k_s, G_s, Y_s, R_f, tmp_f, C, sub, A_s)   # cols(dA b, K)
                    for i, d in T.Parallel(C, BK):
                        dK_f[i, d] = dK_f[i, d] + R_f[i, d]
                        dG_f[i, d] = dG_f[i, d] - k_s[i, d] * R_f[i, d]
                for i, d in T.Parallel(C, BK):
                    if i < L:
                        dK[bb, t0 + i, bh, d0 + d] = dK[bb, t0 + i, bh, d0 + d] + dK_f[i, d]
                        if not finish_gate:
                            dG[bb, t0 + i, bh, d0 + d] = dG[bb, t0 + i, bh, d0 + d] + dG_f[i, d]
            if finish_gate:
                finished_gate(dG, to_end, dG_last, dG_f, G_s, bb, bh, c, t0, L, d0)

    if finish_gate:
        @T.prim_func
        def with_the_gate(
            Q: T.Tensor([B, S, H, DK], dtype),
            K: T.Tensor([B, S, H, DK], dtype),
            G: T.Tensor([B, H, NC * C, DK], ACCUM),
            dPs: T.Tensor([B, S, H, C], dtype),
            dAb: T.Tensor([B, S, H, C], dtype),
            scale: T.float32,
            dQ: T.Tensor([B, S, H, DK], ACCUM),
            dK: T.Tensor([B, S, H, DK], ACCUM),
            dG: T.Tensor([B, S, H, DK], ACCUM),
            to_end: T.Tensor([B, S, H, DK], ACCUM),
            dG_last: T.Tensor([B, H, NC, DK], ACCUM),
        ):
            body(Q, K, G, dPs, dAb, scale, dQ, dK, dG, to_end, dG_last)

        return with_the_gate

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        G: T.Tensor([B, H, NC * C, DK], ACCUM),
        dPs: T.Tensor([B, S, H, C], dtype),
        dAb: T.Tensor([B, S, H, C], dtype),
        scale: T.float32,
        dQ: T.Tensor([B, S, H, DK], ACCUM),
        dK: T.Tensor([B, S, H, DK], ACCUM),
        dG: T.Tensor([B, S, H, DK], ACCUM),
    ):
        body(Q, K, G, dPs, dAb, scale, dQ, dK, dG, None, None)        # no gate to finish: never read

    return main


chunk_pair_gradients.compile_flags = ("-ftz=true",)
# --8<-- [end:chunk_pair_gradients]


@T.macro
def pair_scores(x_s, y_s, G_s, X_s, Y_s, out_f, C, sub, strict):
    """``out_ij = sum_d x_id y_jd 2^(G_id - G_jd)`` for ``j < i`` (``strict``) or ``j <= i``, else 0: the
    pairs in different sub-chunks by one GEMM per sub-chunk ``r`` > 0 (rows of ``r`` scaled to its first
    row ``r0``, the rows before ``r0`` from it; both factors <= 1), the pairs inside one pair by pair."""
    DK = x_s.shape[1]
    T.clear(out_f)
    for r in range(1, C // sub):
        r0 = r * sub
        for i, d in T.Parallel(C, DK):
            X_s[i, d] = T.if_then_else(i >= r0 and i < r0 + sub,
                                       x_s[i, d] * decay_factor(G_s[i, d] - G_s[r0, d]), 0.0)
            Y_s[i, d] = T.if_then_else(i < r0, y_s[i, d] * decay_factor(G_s[r0, d] - G_s[i, d]), 0.0)
        T.gemm(X_s, Y_s, out_f, transpose_B=True)
    for i, j in T.Parallel(C, C):
        if i // sub == j // sub and (j < i if strict else j <= i):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for d in T.serial(DK):
                acc += T.Cast(ACCUM, x_s[i, d]) * T.Cast(ACCUM, y_s[j, d]) * decay_factor(G_s[i, d] - G_s[j, d])
            out_f[i, j] = out_f[i, j] + acc


# --8<-- [start:chunk_pair_pieces]
def chunk_pair_pieces(DK, chunk_size=64, dtype="bfloat16", delta_rule=True, threads=256, scores=True):
    """What the chunk stage for a gate per channel needs of the forward's pairs. Arguments at run time:
    ``Q, K [B, T, H, DK]`` (dtype), ``g [B, T, H, DK]`` (float32, natural log), ``beta [B, T, H]``
    (float32), ``scale``; then the outputs ``G [B, H, NC C, DK]`` (float32: each chunk's cumulative gate
    in log2 units, flat past the end), ``Tinv [B, T, H, C]`` (dtype: ``T = (I + A)^-1``, ``A = stril(diag(b)
    K K^T E)``, level 4's solve), ``P [B, T, H, C]`` (dtype: ``scale (Q K^T) E`` on and below the
    diagonal), ``KKE [B, T, H, C]`` (float32: ``stril(K K^T E)``) and ``flags [2]`` (int32: a gate not
    finite and ``<= 0``, a ``b`` outside ``[0, 1]``). One block per (chunk, head, batch row).
    ``delta_rule=False`` (level 3): ``G`` and ``P`` only; ``beta`` is not read, ``Tinv`` and ``KKE`` not written.
    ``scores=False``: ``P`` neither made nor written, ``Q`` not read (the caller has the forward's ``A_qk``, the
    same scores, from the ``chunk_intra`` that made the state passes' pieces)."""
    assert scores or delta_rule, "without the delta rule the scores are all this kernel makes"
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, sub = chunk_size, SUB_CHUNK
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        g: T.Tensor([B, S, H, DK], ACCUM),
        beta: T.Tensor([B, S, H], ACCUM),
        scale: T.float32,
        G: T.Tensor([B, H, NC * C, DK], ACCUM),
        Tinv: T.Tensor([B, S, H, C], dtype),
        P: T.Tensor([B, S, H, C], dtype),
        KKE: T.Tensor([B, S, H, C], ACCUM),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
            t0 = c * C
            L = T.min(C, S - t0)
            q_s = T.alloc_shared([C, DK], dtype)
            k_s = T.alloc_shared([C, DK], dtype)
            X_s = T.alloc_shared([C, DK], dtype)
            Y_s = T.alloc_shared([C, DK], dtype)
            G_s = T.alloc_shared([C, DK], ACCUM)
            b_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            CC_f = T.alloc_fragment([C, C], ACCUM)

            if scores:
                load_rows(Q, q_s, bb, t0, bh, L, C, DK)
            load_rows(K, k_s, bb, t0, bh, L, C, DK)
            T.copy(g[bb, t0:t0 + C, bh, :], G_s)
            log2_cumsum_by_columns(G_s, G_s, L, C, DK, flags)       # rows past L: flat
            T.copy(G_s, G[bb, bh, t0:t0 + C, :])
            if delta_rule:
                load_beta_checked(beta, b_s, flags, t0, L, C, bb, bh)
                pair_scores(k_s, k_s, G_s, X_s, Y_s, CC_f, C, sub, True)  # stril(K K^T E)
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = T.if_then_else(j < i, CC_f[i, j] * b_s[i], 0.0)
                    if i < L:
                        KKE[bb, t0 + i, bh, j] = T.if_then_else(j < i, CC_f[i, j], 0.0)
                invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)
                merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)
                for i, j in T.Parallel(C, C):              # the blocks above the diagonal were not written
                    if i < L:
                        Tinv[bb, t0 + i, bh, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK,
                                                                 Tinv_s[i, j], 0.0)
            if scores:
                pair_scores(q_s, k_s, G_s, X_s, Y_s, CC_f, C, sub, False)     # (Q K^T) E
                for i, j in T.Parallel(C, C):
                    if i < L:
                        P[bb, t0 + i, bh, j] = T.if_then_else(j <= i, CC_f[i, j] * scale, 0.0)

    return main


chunk_pair_pieces.compile_flags = ("-ftz=true",)
# --8<-- [end:chunk_pair_pieces]


# --8<-- [start:chunk_state_gradients]
def chunk_state_gradients(DK, DV, chunk_size=64, dtype="bfloat16", delta_rule=True, threads=256, grad_dtype=ACCUM,
                          identities=False):
    """Every term of the chunk stage for a gate per channel but the pair sums, as ``chunk_gradients`` takes
    them for a gate per head, with ``T``, ``P`` and ``stril(K K^T E)`` read from ``chunk_pair_pieces``
    instead of made here. Arguments at run time: ``Q, K [B, T, H, DK]``, ``V, dO [B, T, H, DV]`` (dtype),
    ``G [B, H, NC C, DK]`` (float32, log2, from ``chunk_pair_pieces``), ``beta [B, T, H]`` (float32),
    ``S_in, dS_out [B, H, NC, DK, DV]`` (dtype), ``Tinv, P [B, T, H, C]`` (dtype), ``KKE [B, T, H, C]``
    (float32), ``scale``; then the outputs, float32: ``dQ`` (without the scale and the pair sums), ``dK``,
    ``dG``, ``to_end [B, T, H, DK]`` (per channel), ``dV [B, T, H, DV]``, ``db [B, T, H]``, and in dtype the
    pair matrices that ``chunk_pair_gradients`` sums: ``dPs = stril(dP)`` and ``dAb = dA b``
    ``[B, T, H, C]``. One block per (chunk, head, batch row). ``delta_rule=False`` (level 3): no WY form,
    ``V' = V`` and ``dV = dV'``; ``beta``, ``Tinv`` and ``KKE`` are not read, ``db`` and ``dAb`` not written.
    ``grad_dtype``: that of ``dV`` (final here, written once: the inputs' dtype spares a rounding copy).
    ``identities``: the WY form's products as ``chunk_gradients(identities=True)`` makes them (``V' = T X``, ``Y =
    T^T dV'``, ``dA = -stril(Y V'^T)``; they hold for a gate per channel too): 9 GEMMs a chunk instead of 14."""
    assert delta_rule or not identities, "identities: the delta rule's"
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)
    out = (lambda x: x) if grad_dtype == ACCUM else (lambda x: T.Cast(grad_dtype, x))

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        dO: T.Tensor([B, S, H, DV], dtype),
        G: T.Tensor([B, H, NC * C, DK], ACCUM),
        beta: T.Tensor([B, S, H], ACCUM),
        S_in: T.Tensor([B, H, NC, DK, DV], dtype),
        dS_out: T.Tensor([B, H, NC, DK, DV], dtype),
        Tinv: T.Tensor([B, S, H, C], dtype),
        P: T.Tensor([B, S, H, C], dtype),
        KKE: T.Tensor([B, S, H, C], ACCUM),
        scale: T.float32,
        dQ: T.Tensor([B, S, H, DK], ACCUM),
        dK: T.Tensor([B, S, H, DK], ACCUM),
        dV: T.Tensor([B, S, H, DV], grad_dtype),
        db: T.Tensor([B, S, H], ACCUM),
        dG: T.Tensor([B, S, H, DK], ACCUM),
        to_end: T.Tensor([B, S, H, DK], ACCUM),
        dPs: T.Tensor([B, S, H, C], dtype),
        dAb: T.Tensor([B, S, H, C], dtype),
    ):
        with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
            t0 = c * C
            L = T.min(C, S - t0)
            q_s = T.alloc_shared([C, DK], dtype)          # q; later Xw = b K 2^G
            k_s = T.alloc_shared([C, DK], dtype)
            v_s = T.alloc_shared([C, DV], dtype)
            do_s = T.alloc_shared([C, DV], dtype)
            G_s = T.alloc_shared([C, DK], ACCUM)
            state_s = T.alloc_shared([DK, DV], dtype)     # S, then dS, then S again
            X_s = T.alloc_shared([C, DK], dtype)          # K 2^G, -W, Kd, dW
            Y_s = T.alloc_shared([C, DV], dtype)          # V', later Xu = b V
            Z_s = T.alloc_shared([C, DV], dtype)          # dV'
            T_s = T.alloc_shared([C, C], dtype)
            P_s = T.alloc_shared([C, C], dtype)
            Cc_s = T.alloc_shared([C, C], dtype)          # T diag(b); dT, T^T dT
            b_s = T.alloc_shared([C], ACCUM)
            diag_s = T.alloc_shared([C], ACCUM)
            db_s = T.alloc_shared([C], ACCUM)
            CC_f = T.alloc_fragment([C, C], ACCUM)
            KD_f = T.alloc_fragment([C, DK], ACCUM)
            VD_f = T.alloc_fragment([C, DV], ACCUM)
            dK_f = T.alloc_fragment([C, DK], ACCUM)
            dG_f = T.alloc_fragment([C, DK], ACCUM)
            row_f = T.alloc_fragment([C], ACCUM)

            load_rows(Q, q_s, bb, t0, bh, L, C, DK)
            load_rows(K, k_s, bb, t0, bh, L, C, DK)
            load_rows(V, v_s, bb, t0, bh, L, C, DV)
            load_rows(dO, do_s, bb, t0, bh, L, C, DV)
            load_rows(P, P_s, bb, t0, bh, L, C, C)
            T.copy(G[bb, bh, t0:t0 + C, :], G_s)
            G_last = lambda d: G_s[C - 1, d]

            if delta_rule:
                # W = T diag(b) (K 2^G), U = T diag(b) V, then V' = U - W S
                load_rows(Tinv, T_s, bb, t0, bh, L, C, C)
                for i in T.Parallel(C):
                    b_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
                if identities:                             # V' = T X, X = diag(b) (V - (K 2^G) S) (in Z_s)
                    for i, d in T.Parallel(C, DK):
                        X_s[i, d] = k_s[i, d] * T.exp2(G_s[i, d])
                    T.copy(S_in[bb, bh, c, :, :], state_s)
                    T.gemm(X_s, state_s, VD_f, clear_accum=True)
                    for i, d in T.Parallel(C, DV):
                        Z_s[i, d] = b_s[i] * (v_s[i, d] - VD_f[i, d])
                    T.gemm(T_s, Z_s, VD_f, clear_accum=True)
                    T.copy(VD_f, Y_s)
                else:
                    for i, j in T.Parallel(C, C):
                        Cc_s[i, j] = T_s[i, j] * b_s[j]
                    for i, d in T.Parallel(C, DK):
                        X_s[i, d] = k_s[i, d] * T.exp2(G_s[i, d])
                    new_values(Cc_s, X_s, v_s, S_in, state_s, KD_f, VD_f, Y_s, bb, bh, c)
            else:                                          # no delta rule: V' = V
                T.copy(S_in[bb, bh, c, :, :], state_s)
                T.copy(v_s, Y_s)

            # the state read: dQg = dO S^T, dQ = dQg 2^G (the gate's share dQg Qg comes with dW below, where
            # S is in shared memory again: one more GEMM instead of a fragment held throughout)
            T.gemm(do_s, state_s, KD_f, transpose_B=True, clear_accum=True)
            for i, d in T.Parallel(C, DK):
                KD_f[i, d] = KD_f[i, d] * T.exp2(G_s[i, d])

            # dP = tril(dO V'^T): its diagonal here (E_ii = 1), the pairs below it to chunk_pair_gradients
            T.gemm(do_s, Y_s, CC_f, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                if i == j:
                    diag_s[i] = CC_f[i, j]
                if i < L:
                    dPs[bb, t0 + i, bh, j] = T.if_then_else(j < i, CC_f[i, j], 0.0)
            for i, d in T.Parallel(C, DK):
                if i < L:
                    dQ[bb, t0 + i, bh, d] = KD_f[i, d] + diag_s[i] * k_s[i, d]

            # the state update: dV' = P^T dO + Kd dS, dKd = V' dS^T (dK += dKd 2^(G_last - G))
            T.copy(dS_out[bb, bh, c, :, :], state_s)
            for i, d in T.Parallel(C, DK):
                X_s[i, d] = k_s[i, d] * T.exp2(G_last(d) - G_s[i, d])
            T.gemm(P_s, do_s, VD_f, transpose_A=True, clear_accum=True)
            T.gemm(X_s, state_s, VD_f)
            T.copy(VD_f, Z_s)
            if not delta_rule:                             # dV = dV'
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(VD_f[i, d])
            T.gemm(Y_s, state_s, KD_f, transpose_B=True, clear_accum=True)
            for i, d in T.Parallel(C, DK):
                KD_f[i, d] = KD_f[i, d] * T.exp2(G_last(d) - G_s[i, d])
                dK_f[i, d] = KD_f[i, d] + diag_s[i] * q_s[i, d] * scale              # and dP's diagonal
                if i < L:
                    to_end[bb, t0 + i, bh, d] = KD_f[i, d] * k_s[i, d]           # dKd Kd

            # dW = -dV' S^T (into X_s); the gate's share of the state read, dQg Qg
            T.copy(S_in[bb, bh, c, :, :], state_s)
            if delta_rule and not identities:
                T.gemm(Z_s, state_s, KD_f, transpose_B=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    X_s[i, d] = -KD_f[i, d]
            T.gemm(do_s, state_s, KD_f, transpose_B=True, clear_accum=True)
            for i, d in T.Parallel(C, DK):
                dG_f[i, d] = KD_f[i, d] * T.exp2(G_s[i, d]) * q_s[i, d] * scale

            if identities:
                # Y = T^T dV': dV = b Y, sum_v Y V for db; dXw = -Y S^T (dKg = b dXw); dA = -stril(Y V'^T)
                T.gemm(T_s, Z_s, VD_f, transpose_A=True, clear_accum=True)
                T.copy(VD_f, Z_s)                          # Y, the operand of Y S^T and Y V'^T
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(VD_f[i, d] * b_s[i])
                    VD_f[i, d] = VD_f[i, d] * v_s[i, d]
                T.reduce_sum(VD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = row_f[i]
                T.gemm(Z_s, state_s, KD_f, transpose_B=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    dK_f[i, d] = dK_f[i, d] - KD_f[i, d] * b_s[i] * T.exp2(G_s[i, d])     # dKg 2^G
                    KD_f[i, d] = -KD_f[i, d] * k_s[i, d] * T.exp2(G_s[i, d])             # dXw Kg
                    dG_f[i, d] = dG_f[i, d] + KD_f[i, d] * b_s[i]
                T.reduce_sum(KD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = db_s[i] + row_f[i]
                T.gemm(Z_s, Y_s, CC_f, transpose_B=True, clear_accum=True)    # Y V'^T
            elif delta_rule:
                # the WY form: dXu = T^T dV' (dV = b dXu), dXw = T^T dW (dKg = b dXw)
                T.gemm(T_s, Z_s, VD_f, transpose_A=True, clear_accum=True)
                for i, d in T.Parallel(C, DV):
                    if i < L:
                        dV[bb, t0 + i, bh, d] = out(VD_f[i, d] * b_s[i])
                    VD_f[i, d] = VD_f[i, d] * v_s[i, d]
                T.reduce_sum(VD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = row_f[i]
                T.gemm(T_s, X_s, KD_f, transpose_A=True, clear_accum=True)
                for i, d in T.Parallel(C, DK):
                    dK_f[i, d] = dK_f[i, d] + KD_f[i, d] * b_s[i] * T.exp2(G_s[i, d])     # dKg 2^G
                    KD_f[i, d] = KD_f[i, d] * k_s[i, d] * T.exp2(G_s[i, d])               # dXw Kg
                    dG_f[i, d] = dG_f[i, d] + KD_f[i, d] * b_s[i]
                T.reduce_sum(KD_f, row_f, dim=1)
                for i in T.Parallel(C):
                    db_s[i] = db_s[i] + row_f[i]
                for i, d in T.Parallel(C, DV):
                    Y_s[i, d] = v_s[i, d] * b_s[i]                            # Xu
                for i, d in T.Parallel(C, DK):
                    q_s[i, d] = k_s[i, d] * T.exp2(G_s[i, d]) * b_s[i]         # Xw
                T.gemm(Z_s, Y_s, CC_f, transpose_B=True, clear_accum=True)    # dT = dV' Xu^T
                T.gemm(X_s, q_s, CC_f, transpose_B=True)                      #    + dW Xw^T
                T.copy(CC_f, Cc_s)
                T.gemm(T_s, Cc_s, CC_f, transpose_A=True, clear_accum=True)   # T^T dT
                T.copy(CC_f, Cc_s)
                T.gemm(Cc_s, T_s, CC_f, transpose_B=True, clear_accum=True)   # (T^T dT) T^T
            if delta_rule:
                # dA = -stril(T^T dT T^T): db += sum_j dA_ij stril(K K^T E)_ij; dA b to chunk_pair_gradients
                for i, j in T.Parallel(C, C):
                    CC_f[i, j] = T.if_then_else(j < i, -CC_f[i, j], 0.0)
                    if i < L:
                        dAb[bb, t0 + i, bh, j] = CC_f[i, j] * b_s[i]
                for i, j in T.Parallel(C, C):
                    CC_f[i, j] = T.if_then_else(i < L, CC_f[i, j] * KKE[bb, t0 + T.min(i, L - 1), bh, j], 0.0)
                T.reduce_sum(CC_f, row_f, dim=1)
                for i in T.Parallel(C):
                    if i < L:
                        db[bb, t0 + i, bh] = db_s[i] + row_f[i]
            for i, d in T.Parallel(C, DK):
                if i < L:
                    dK[bb, t0 + i, bh, d] = dK_f[i, d]
                    dG[bb, t0 + i, bh, d] = dG_f[i, d]

    return main


chunk_state_gradients.compile_flags = ("-ftz=true",)
# --8<-- [end:chunk_state_gradients]


# ---- the launchers ----

def run_chunk_gradients(q, k, v, g, beta, do, S, dS, scale, dtype, final_dtype=False, inverse=None,
                        identities=False):
    """``chunk_gradients`` on every chunk of ``q, k, v, do [B, T, H, *]`` with a gate per head ``g [B, T, H]``
    and ``beta [B, T, H]`` (``None``: no delta rule), the states entering the chunks and the gradients of those
    leaving them (``S``, ``dS [B, H, NC, DK, DV]``, rounded to ``dtype`` as the kernel reads them). Returns the
    kernel's outputs: ``dq`` (scale in), ``dk``, ``dv`` (in ``dtype`` with ``final_dtype``, else float32), and
    ``db``, ``dG`` (every term of the gate's gradient but the decay to the chunk's end) and ``to_end`` (that
    decay's terms), float32 ``[B, T, H]``. ``inverse``: ``{"Tinv", "KKE", "P"}`` ``[B, T, H, C]`` as the
    forward's ``chunk_intra`` wrote them with ``backward_outputs``: the kernel compiled with ``pieces_in`` reads
    them. ``identities``: the kernel compiled with them (the delta rule's fewer GEMMs)."""
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV = v.shape[-1]
    low = lambda x: x.to(dtype).contiguous()
    grads = dict(grad_dtype=launch.dtype_name(dtype)) if final_dtype else {}
    pieces = dict(pieces_in=True) if inverse is not None else {}
    if identities and beta is not None:
        pieces["identities"] = True
    with torch.cuda.device(q.device):
        kernel = compile_program(chunk_gradients, (), DK=DK, DV=DV, chunk_size=CHUNK_SIZE,
                                 dtype=launch.dtype_name(dtype), delta_rule=beta is not None, **grads, **pieces)
        new = lambda *shape, dt=torch.float32: launch.new_output(shape, dt, q.device)
        out = dtype if final_dtype else torch.float32
        dq, dk, dv = new(B, T, H, DK, dt=out), new(B, T, H, DK, dt=out), new(B, T, H, DV, dt=out)
        db, dG, to_end = new(B, T, H), new(B, T, H), new(B, T, H)
        flags = torch.zeros(2, dtype=torch.int32, device=q.device)    # the forward checked g and beta
        b = beta.float().contiguous() if beta is not None else db      # without the delta rule: not read
        read = [inverse["Tinv"], inverse["KKE"], inverse["P"]] if inverse is not None else []
        kernel(low(q), low(k), low(v), low(do), g.float().unsqueeze(-1).contiguous(), b,
               low(S), low(dS), *read, float(scale), dq, dk, dv, db, dG, to_end, flags)
    return dq, dk, dv, db, dG, to_end


def run_channel_gradients(q, k, v, g, beta, do, S, dS, scale, dtype, pair_options, dG_last=None, scores=None,
                          final_dtype=False, pair_pieces=None, identities=False):
    """The chunk stage for a gate per channel (KDA) by the three kernels that split it: ``chunk_pair_pieces``
    (the cumulative gate, ``T``, the scores ``P`` and ``stril(K K^T E)``, whose pair decays need sub-chunks),
    ``chunk_state_gradients`` (every GEMM with the states, the WY form, ``dP`` and ``dA b`` written out) and
    ``chunk_pair_gradients`` compiled with ``pair_options`` (the sums of ``dP`` and ``dA b`` over pairs into
    ``dq``, ``dk`` and the gate). Returns ``dq`` (scale in), ``dk``, ``dv``, ``dG``, ``to_end``, ``dG_last`` and
    ``db``: with ``finish_gate`` in ``pair_options`` ``dG`` is the gate's gradient ``[B, T, H, DK]``, else its rows
    before the reverse sums (``to_end`` and ``dG_last`` their other terms). Without the delta rule (``beta=None``,
    level 3) the kernels are compiled without the WY form. ``dG_last [B, H, NC, DK]``: the chunk decays' gate
    terms where the reverse pass made them, else taken here from ``S`` and ``dS``. ``scores``: ``P [B, T, H, C]``
    in ``dtype`` as the forward's ``chunk_intra`` made it, else made by ``chunk_pair_pieces``. ``final_dtype``:
    ``dv`` in ``dtype``, as ``chunk_state_gradients`` rounds it once. ``pair_pieces``: ``{"G", "Tinv", "KKE"}`` as
    the forward's ``chunk_intra`` wrote them (with ``scores``): ``chunk_pair_pieces`` does not run. ``identities``:
    ``chunk_state_gradients`` compiled with them (the WY form's fewer GEMMs)."""
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV, C, NC = v.shape[-1], CHUNK_SIZE, S.shape[2]
    low = lambda x: x.to(dtype).contiguous()
    config = dict(chunk_size=C, dtype=launch.dtype_name(dtype), delta_rule=beta is not None)
    assert pair_pieces is None or scores is not None, "the forward's pair pieces come with its scores"
    with torch.cuda.device(q.device):
        made = dict(scores=False) if scores is not None else {}
        pieces = None if pair_pieces is not None else compile_program(chunk_pair_pieces, (), DK=DK, **config,
                                                                      **made)
        grads = dict(grad_dtype=launch.dtype_name(dtype)) if final_dtype else {}
        walk = dict(identities=True) if identities and beta is not None else {}
        states = compile_program(chunk_state_gradients, (), DK=DK, DV=DV, **config, **grads, **walk)
        pairs = compile_program(chunk_pair_gradients, (), DK=DK, **config, **pair_options)
        new = lambda *shape, dt=torch.float32: launch.new_output(shape, dt, q.device)
        Q, K = low(q), low(k)
        db = new(B, T, H)
        b = beta.float().contiguous() if beta is not None else db      # without the delta rule: not read
        P = scores if scores is not None else new(B, T, H, C, dt=dtype)
        if pair_pieces is not None:
            G, Tinv, KKE = pair_pieces["G"], pair_pieces["Tinv"], pair_pieces["KKE"]
        else:
            G, KKE, Tinv = new(B, H, NC * C, DK), new(B, T, H, C), new(B, T, H, C, dt=dtype)
            flags = torch.zeros(2, dtype=torch.int32, device=q.device)    # the forward checked g and beta
            pieces(Q, K, g.float().contiguous(), b, float(scale), G, Tinv, P, KKE, flags)
        dq, dk, dG, to_end = (new(B, T, H, DK) for _ in range(4))
        dv = new(B, T, H, DV, dt=dtype if final_dtype else torch.float32)
        dPs, dAb = new(B, T, H, C, dt=dtype), new(B, T, H, C, dt=dtype)
        states(Q, K, low(v), low(do), G, b, low(S), low(dS), Tinv, P, KKE, float(scale), dq, dk, dv, db, dG, to_end,
               dPs, dAb)
        if dG_last is None:
            decay = torch.exp2(G.view(B, H, NC, C, DK)[:, :, :, -1])     # the cumulative gate's last row, flat past T
            dG_last = torch.einsum("bhnkv,bhnkv->bhnk", S, dS) * decay                # [B, H, NC, DK]
        if pair_options.get("finish_gate"):            # the kernel leaves dG as the gate's gradient
            pairs(Q, K, G, dPs, dAb, float(scale), dq, dk, dG, to_end, dG_last.float().contiguous())
        else:
            pairs(Q, K, G, dPs, dAb, float(scale), dq, dk, dG)
    return dq, dk, dv, dG, to_end, dG_last, db
