"""Level 5 TileLang kernels: the gated delta rule (KDA; GDN is its scalar-gate case).

Per chunk, with ``G`` the chunk-local cumsum of the gate in log2 units (``kda.kernels.level3``)
and ``b`` the step sizes, the chunk form computed here is

* ``A_kk = tril(diag(b) (K 2^G)(K 2^-G)^T, -1)`` and ``T = (I + A_kk)^-1``,
* ``W = T diag(b) (K 2^G)`` and ``U = T diag(b) V``,
* ``V_new = U - W S``, ``O = (scale Q 2^G) S + A_qk V_new``,
* ``S <- diag(2^G_last) S + (K 2^(G_last - G))^T V_new``.

Stages:

1. ``kda.kernels.level3.chunk_prepare`` twice, all chunks at once: with ``(Q, K, scale)`` for
   ``Qw = scale Q 2^G``, ``Kw = K 2^(G_last - G)``, the chunk decay and ``A_qk``; with
   ``(K, K, 1)`` and float32 scores for ``K 2^G`` and the unmasked ``A_kk``. Both score
   matrices use level 3's sub-chunk reference points, safe for any gate.
2. ``chunk_wy_gated``: the solve of level 4 on ``A_kk``, then ``W`` and ``U``.
3. ``gated_state_output_pass``: sequential over chunks, the output fused.

Mirrors ``kda.reference.level5``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.level3 import real
from kda.kernels.level4 import invert_diagonal_blocks, merge_by_substitution

ACCUM = "float32"


# --8<-- [start:chunk_wy_gated]
def chunk_wy_gated(DK, DV, chunk_size=64, block=16, dtype="bfloat16", threads=128):
    """Arguments at run time: ``Kg = K 2^G [B, T, H, DK]``, ``V [B, T, H, DV]``, ``beta [B, T, H]``
    (float32), ``A_kk [B, T, H, C]`` (float32, the decayed ``k_i . k_j`` for ``j <= i``), then the
    outputs ``W [B, T, H, DK]`` and ``U [B, T, H, DV]``."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size

    @T.prim_func
    def main(
        Kg: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        beta: T.Tensor([B, S, H], ACCUM),
        A_kk: T.Tensor([B, S, H, C], ACCUM),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
    ):
        with T.Kernel(T.ceildiv(S, C), H, B, threads=threads) as (c, bh, bb):
            t0 = c * C
            L = T.min(C, S - t0)
            K_s = T.alloc_shared([C, DK], dtype)
            V_s = T.alloc_shared([C, DV], dtype)
            beta_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, DV], ACCUM)

            T.copy(Kg[bb, t0:t0 + C, bh, :], K_s)
            T.copy(V[bb, t0:t0 + C, bh, :], V_s)
            T.copy(A_kk[bb, t0:t0 + C, bh, :], A_s)
            for i in T.Parallel(C):                            # padding rows: b = 0
                beta_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
            for i, j in T.Parallel(C, C):                      # padding rows of A_kk may be
                A_s[i, j] = A_s[i, j] * beta_s[i] * real(j < i)   # anything finite: b = 0 there
            invert_diagonal_blocks(A_s, Tinv_s, C, block)
            merge_by_substitution(A_s, Tinv_s, C, block)
            for i, j in T.Parallel(C, C):
                Tb_s[i, j] = Tinv_s[i, j] * beta_s[j]
            T.gemm(Tb_s, K_s, W_f, clear_accum=True)
            T.gemm(Tb_s, V_s, U_f, clear_accum=True)
            T.copy(W_f, K_s)                                   # through shared: whole-row stores
            T.copy(U_f, V_s)
            T.copy(K_s, W[bb, t0:t0 + C, bh, :])
            T.copy(V_s, U[bb, t0:t0 + C, bh, :])

    return main
# --8<-- [end:chunk_wy_gated]


# --8<-- [start:gated_state_output_pass]
def gated_state_output_pass(DK, DV, chunk_size=64, block_dv=32, num_stages=2, threads=128, dtype="bfloat16"):
    """Arguments at run time: ``Qw, Kw, W [B, T, H, DK]``, ``U [B, T, H, DV]``, ``A_qk [B, T, H, C]``
    (dtype, scale included), ``decay [B, H, NC, DK]`` and ``h0 [B, H, DK, DV]`` (float32), then the
    outputs ``O [B, T, H, DV]`` (dtype) and ``ht`` (float32)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Qw: T.Tensor([B, S, H, DK], dtype),
        Kw: T.Tensor([B, S, H, DK], dtype),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        A_qk: T.Tensor([B, S, H, C], dtype),
        decay: T.Tensor([B, H, NC, DK], ACCUM),
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, block_dv), H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            Qw_s = T.alloc_shared([C, DK], dtype)
            Kw_s = T.alloc_shared([C, DK], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            A_s = T.alloc_shared([C, C], dtype)
            U_s = T.alloc_shared([C, block_dv], dtype)
            decay_s = T.alloc_shared([DK], ACCUM)
            S_s = T.alloc_shared([DK, block_dv], dtype)
            Vn_s = T.alloc_shared([C, block_dv], dtype)
            O_s = T.alloc_shared([C, block_dv], dtype)
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            WS = T.alloc_fragment([C, block_dv], ACCUM)
            acc_o = T.alloc_fragment([C, block_dv], ACCUM)
            T.copy(h0[bb, bh, :, dv0:dv0 + block_dv], S_f)
            for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
                T.copy(Qw[bb, c * C:(c + 1) * C, bh, :], Qw_s)
                T.copy(Kw[bb, c * C:(c + 1) * C, bh, :], Kw_s)
                T.copy(W[bb, c * C:(c + 1) * C, bh, :], W_s)
                T.copy(A_qk[bb, c * C:(c + 1) * C, bh, :], A_s)
                T.copy(U[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], U_s)
                T.copy(decay[bb, bh, c, :], decay_s)
                T.copy(S_f, S_s)
                # every GEMM waits: each reads a different pipelined buffer, and tilelang
                # 0.1.15 hands a buffer back to the producer once its last GEMM is issued
                T.gemm(W_s, S_s, WS, clear_accum=True)
                T.gemm(Qw_s, S_s, acc_o, clear_accum=True)
                for i, j in T.Parallel(C, block_dv):
                    Vn_s[i, j] = U_s[i, j] - WS[i, j]
                T.gemm(A_s, Vn_s, acc_o)
                for i, j in T.Parallel(DK, block_dv):
                    S_f[i, j] = S_f[i, j] * decay_s[i]
                T.gemm(Kw_s, Vn_s, S_f, transpose_A=True)
                T.copy(acc_o, O_s)
                T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])
            T.copy(S_f, ht[bb, bh, :, dv0:dv0 + block_dv])

    return main
# --8<-- [end:gated_state_output_pass]
