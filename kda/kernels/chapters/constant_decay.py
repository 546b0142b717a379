"""Level 2 TileLang kernel: ``S <- a S + k v^T`` with a constant decay ``a`` per head.

The grid and loop are those of ``kda.kernels.chapters.linear_attention.seq_in_loop``; the decay adds the
three weight places of the chunk identity, all computed as ``exp2`` of a non-positive
number so that no factor above 1 is ever formed:

1. intra-chunk mask ``a^(i-j)``, evaluated only where ``j <= i``;
2. the keys decayed to the chunk end, ``a^(L-1-r)``: applied to the value rows instead
   (``K^T diag(w) V`` is the same product and ``V`` is the narrower operand);
3. the state carried over a chunk, ``a^L``, and the query weight ``a^(i+1)``, applied to
   the rows of ``Q S`` after the GEMM (the same numbers as scaling ``Q``, with no reload).

``a`` arrives at run time as ``log2(a)`` per head (float32 ``[H]``), so one compiled kernel
serves every decay. ``L`` is the real chunk length; it is shorter only for the tail,
which matters for the final state. Mirrors ``kda.reference.level2.seq_in_loop``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.stages import ACCUM, load_state, state_shape, store_state



# --8<-- [start:seq_in_loop]
def seq_in_loop(DK, DV, chunk_size=64, block_dv=32, num_stages=3, threads=128,
                dtype="bfloat16", initial_state=False, final_state=False, overlap_gemms=True, weight_tables=False):
    """Arguments at run time: ``Q, K, V, log2_alpha [H], scale, h0``, then the outputs ``O``, ``ht``.
    The state flags and ``overlap_gemms`` as in ``kda.kernels.chapters.linear_attention.seq_in_loop``.

    ``Gamma`` (``C x C``) is always a table built once per block. ``weight_tables=True``
    also tabulates the query and key weights and ``a^C``, so that a full chunk calls no
    ``exp2`` at all; the default computes those ``2 C block_dv + 1`` values per chunk.
    """
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NV = T.ceildiv(DV, block_dv)

    @T.macro
    def decay_state(V_s, Vw_s, S_f, W_key, carry, lg, L):
        """``S = a^L S``, and the value rows weighted by ``a^(L-1-r)`` for ``S += K^T Vw``."""
        if weight_tables:   # tables for full chunks; only a tail chunk (L < C) calls exp2
            for i, j in T.Parallel(DK, block_dv):
                S_f[i, j] = S_f[i, j] * T.if_then_else(L == C, carry, T.exp2(lg * L))
            for r, j in T.Parallel(C, block_dv):
                Vw_s[r, j] = T.if_then_else(
                    L == C, V_s[r, j] * W_key[r, j],
                    T.if_then_else(r < L, V_s[r, j] * T.exp2(lg * (L - 1 - r)), 0.0))
        else:
            for i, j in T.Parallel(DK, block_dv):                 # place 3, carry side
                S_f[i, j] = S_f[i, j] * T.exp2(lg * L)
            # place 2; rows past L load as zeros, so no mask is needed (a branch per element
            # cost 9-12%, run 57), and the exponent is clamped so that no factor exceeds 1
            for r, j in T.Parallel(C, block_dv):
                Vw_s[r, j] = V_s[r, j] * T.exp2(T.min(lg * (L - 1 - r), 0.0))

    @T.macro
    def chunk_loop(Q, K, V, O, log2_alpha, scale, S_f, bb, bh, dv0):
        Q_s = T.alloc_shared([C, DK], dtype)
        K_s = T.alloc_shared([C, DK], dtype)
        V_s = T.alloc_shared([C, block_dv], dtype)
        Vw_s = T.alloc_shared([C, block_dv], dtype)     # V rows weighted by a^(L-1-r)
        S_s = T.alloc_shared([DK, block_dv], dtype)
        O_s = T.alloc_shared([C, block_dv], dtype)
        acc_o = T.alloc_fragment([C, block_dv], ACCUM)
        A = T.alloc_fragment([C, C], ACCUM)
        A_cast = T.alloc_fragment([C, C], dtype)
        Gamma = T.alloc_fragment([C, C], ACCUM)          # place 1: scale * a^(i-j), j <= i
        W_query = T.alloc_fragment([C, block_dv], ACCUM)  # place 3: scale * a^(i+1)
        W_key = T.alloc_fragment([C, block_dv], ACCUM)    # place 2: a^(C-1-r)
        lg = T.alloc_local([1], ACCUM)
        carry = T.alloc_local([1], ACCUM)                 # place 3: a^C
        lg[0] = log2_alpha[bh]
        carry[0] = T.exp2(lg[0] * C)
        # Gamma depends on (i - j) only: build it once per block, and only where j <= i
        # (a^(negative) would be huge, and huge * 0 = NaN)
        for i, j in T.Parallel(C, C):
            Gamma[i, j] = T.if_then_else(j <= i, scale * T.exp2(lg[0] * (i - j)), 0.0)
        if weight_tables:
            for i, j in T.Parallel(C, block_dv):
                W_query[i, j] = scale * T.exp2(lg[0] * (i + 1))
            for r, j in T.Parallel(C, block_dv):
                W_key[r, j] = T.exp2(lg[0] * (C - 1 - r))

        for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
            L = T.min(C, S - c * C)                      # real length of this chunk
            T.copy(Q[bb, c * C:(c + 1) * C, bh, :], Q_s)
            T.copy(K[bb, c * C:(c + 1) * C, bh, :], K_s)
            T.copy(V[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], V_s)
            T.copy(S_f, S_s)                             # the state before this chunk
            if overlap_gemms:
                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L)
                # Only the last GEMM waits (for all three). It must be one that reads Q_s
                # and K_s: tilelang 0.1.15 hands a pipelined buffer back to the producer
                # right after its last GEMM is issued, waited for or not.
                T.gemm(K_s, Vw_s, S_f, transpose_A=True, annotations={"wg_wait": -1})
                T.gemm(Q_s, S_s, acc_o, clear_accum=True, annotations={"wg_wait": -1})
                T.gemm(Q_s, K_s, A, transpose_B=True, clear_accum=True)
            else:
                T.gemm(Q_s, S_s, acc_o, clear_accum=True)
                T.gemm(Q_s, K_s, A, transpose_B=True, clear_accum=True)
            # inter-chunk term: scale * (Q S_prev) * a^(i+1)     (place 3, read side)
            if weight_tables:
                for i, j in T.Parallel(C, block_dv):
                    acc_o[i, j] = acc_o[i, j] * W_query[i, j]
            else:
                for i, j in T.Parallel(C, block_dv):
                    acc_o[i, j] = acc_o[i, j] * (scale * T.exp2(lg[0] * (i + 1)))
            # intra-chunk term: scale * (Q K^T * Gamma) V         (place 1)
            for i, j in T.Parallel(C, C):
                A[i, j] = A[i, j] * Gamma[i, j]
            T.copy(A, A_cast)
            T.gemm(A_cast, V_s, acc_o)
            T.copy(acc_o, O_s)
            T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])
            if not overlap_gemms:
                # after the write-back: first S = a^L S, then S += K^T (w V)
                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L)
                T.gemm(K_s, Vw_s, S_f, transpose_A=True)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        log2_alpha: T.Tensor([H], ACCUM),
        scale: T.float32,
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(NV, H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            load_state(h0, S_f, bb, bh, dv0, initial_state)
            chunk_loop(Q, K, V, O, log2_alpha, scale, S_f, bb, bh, dv0)
            store_state(S_f, ht, bb, bh, dv0, final_state)

    return main
# --8<-- [end:seq_in_loop]
