"""The delta rule's state and output as two stages (the level-4 chapter's first split).

1. ``state_pass``: sequence in a loop, grid (value stripes, H, B), state in registers; per
   chunk it writes the entering state (the snapshot the output stage reads) and the corrected
   values ``U - W S``, then ``S += K^T (U - W S)``.
2. ``chunk_output``: all chunks at once, ``O = scale (Q S_enter + tril(Q K^T) (U - W S_enter))``.

``kda.delta_rule`` runs the two fused instead (``kernels.linear_pass.state_output_pass``). Mirrors
``kda.reference.level4`` (its stages).
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.stages import ACCUM, real


# --8<-- [start:state_pass]
def state_pass(DK, DV, chunk_size=64, block_dv=32, num_stages=2, threads=128, dtype="bfloat16"):
    """Arguments at run time: ``K, W [B, T, H, DK]``, ``U [B, T, H, DV]``, ``h0 [B, H, DK, DV]``
    (float32), then the outputs ``h [B, NC, H, DK, DV]`` (dtype: the state entering each
    chunk), ``V_new [B, T, H, DV]`` (dtype: ``U - W S``) and ``ht`` (float32)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        h: T.Tensor([B, NC, H, DK, DV], dtype),
        V_new: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, block_dv), H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            K_s = T.alloc_shared([C, DK], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            U_s = T.alloc_shared([C, block_dv], dtype)
            S_s = T.alloc_shared([DK, block_dv], dtype)
            Vn_s = T.alloc_shared([C, block_dv], dtype)
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            WS = T.alloc_fragment([C, block_dv], ACCUM)
            T.copy(h0[bb, bh, :, dv0:dv0 + block_dv], S_f)
            for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
                T.copy(K[bb, c * C:(c + 1) * C, bh, :], K_s)
                T.copy(W[bb, c * C:(c + 1) * C, bh, :], W_s)
                T.copy(U[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], U_s)
                T.copy(S_f, S_s)                           # the snapshot, cast like fla's h
                T.copy(S_s, h[bb, c, bh, :, dv0:dv0 + block_dv])
                T.gemm(W_s, S_s, WS, clear_accum=True)
                for i, j in T.Parallel(C, block_dv):
                    Vn_s[i, j] = U_s[i, j] - WS[i, j]
                T.copy(Vn_s, V_new[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])
                T.gemm(K_s, Vn_s, S_f, transpose_A=True)
            T.copy(S_f, ht[bb, bh, :, dv0:dv0 + block_dv])

    return main
# --8<-- [end:state_pass]


# --8<-- [start:chunk_output]
def chunk_output(DK, DV, chunk_size=64, block_dv=64, threads=128, dtype="bfloat16"):
    """Arguments at run time: ``Q, K [B, T, H, DK]``, ``h [B, NC, H, DK, DV]``, ``V_new
    [B, T, H, DV]``, ``scale``, then the output ``O [B, T, H, DV]``."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)
    NV = DV // block_dv

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        h: T.Tensor([B, NC, H, DK, DV], dtype),
        V_new: T.Tensor([B, S, H, DV], dtype),
        scale: T.float32,
        O: T.Tensor([B, S, H, DV], dtype),
    ):
        # a grid of three axes: bh and bb as block indices, not divisions by the dynamic H
        with T.Kernel(NC * NV, H, B, threads=threads) as (cv, bh, bb):
            c, dv0 = cv // NV, (cv % NV) * block_dv
            t0 = c * C
            Q_s = T.alloc_shared([C, DK], dtype)
            K_s = T.alloc_shared([C, DK], dtype)
            h_s = T.alloc_shared([DK, block_dv], dtype)
            Vn_s = T.alloc_shared([C, block_dv], dtype)
            O_s = T.alloc_shared([C, block_dv], dtype)
            acc = T.alloc_fragment([C, block_dv], ACCUM)
            QK = T.alloc_fragment([C, C], ACCUM)
            QK_cast = T.alloc_fragment([C, C], dtype)
            T.copy(Q[bb, t0:t0 + C, bh, :], Q_s)
            T.copy(K[bb, t0:t0 + C, bh, :], K_s)
            T.copy(h[bb, c, bh, :, dv0:dv0 + block_dv], h_s)
            T.copy(V_new[bb, t0:t0 + C, bh, dv0:dv0 + block_dv], Vn_s)
            T.gemm(Q_s, h_s, acc, clear_accum=True)
            T.gemm(Q_s, K_s, QK, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                QK[i, j] = QK[i, j] * real(j <= i)
            T.copy(QK, QK_cast)
            T.gemm(QK_cast, Vn_s, acc)
            for i, j in T.Parallel(C, block_dv):
                O_s[i, j] = acc[i, j] * scale
            T.copy(O_s, O[bb, t0:t0 + C, bh, dv0:dv0 + block_dv])

    return main
# --8<-- [end:chunk_output]
