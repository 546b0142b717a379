"""Level 4 TileLang kernels: the delta rule, one function per stage.

1. ``chunk_wy``: per chunk and all chunks at once, ``A = tril(diag(b) K K^T, -1)``, the inverse
   ``(I + A)^-1`` (``solve_unit_lower``: 16 x 16 diagonal blocks by forward substitution, then
   block forward substitution), and ``W = (I + A)^-1 diag(b) K``, ``U = (I + A)^-1 diag(b) V``.
2. ``state_pass``: sequence in a loop, grid over (value stripes, B*H), state in registers; per
   chunk it writes the entering state (the snapshot the output stage reads) and the corrected
   values ``U - W S``, then ``S += K^T (U - W S)``.
3. ``chunk_output``: all chunks at once, ``O = scale (Q S_enter + tril(Q K^T) (U - W S_enter))``.

Mirrors ``kda.reference.level4`` (``kernel_mimic`` and its stages). Not yet run on a GPU.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

ACCUM = "float32"


# --8<-- [start:solve_unit_lower]
@T.macro
def solve_unit_lower(A_s, Tinv_s, X_s, C, block):
    """``Tinv_s = (I + A_s)^-1`` for strictly lower ``A_s [C, C]`` (float32, shared).

    The diagonal ``block x block`` blocks are independent: row ``r`` of block ``I`` is
    ``e_r - sum_{j<r} A_rj (row j)``, one row per step for all blocks at once. Below the
    diagonal, block ``(I, J)`` needs the blocks ``(K, J)`` with ``J <= K < I``: by distance
    ``d = I - J``, ``X = sum_K A_IK T_KJ`` and then ``T_IJ = -T_II X``.
    """
    n = C // block
    for i, j in T.Parallel(C, C):
        Tinv_s[i, j] = T.if_then_else(i == j, 1.0, 0.0)
    # the next loop runs on n * block threads only, and tilelang 0.1.15 then syncs just those:
    # make every thread's writes of A_s and Tinv_s visible first
    T.sync_threads()
    for r in T.serial(1, block):
        for I, c in T.Parallel(n, block):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for j in T.serial(r):
                acc += A_s[I * block + r, I * block + j] * Tinv_s[I * block + j, I * block + c]
            Tinv_s[I * block + r, I * block + c] = Tinv_s[I * block + r, I * block + c] - acc
    for d in T.unroll(1, n):
        for p, r, c in T.Parallel(n - d, block, block):   # block (I, J) = (p + d, p)
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block * d):
                acc += A_s[(p + d) * block + r, p * block + m] * Tinv_s[p * block + m, p * block + c]
            X_s[p, r, c] = acc
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block):
                acc += Tinv_s[(p + d) * block + r, (p + d) * block + m] * X_s[p, m, c]
            Tinv_s[(p + d) * block + r, p * block + c] = -acc
# --8<-- [end:solve_unit_lower]


# --8<-- [start:chunk_wy]
def chunk_wy(DK, DV, chunk_size=64, block=16, dtype="bfloat16", threads=128):
    """Arguments at run time: ``K [B, T, H, DK]``, ``V [B, T, H, DV]``, ``beta [B, T, H]``
    (float32), then the outputs ``W [B, T, H, DK]``, ``U [B, T, H, DV]`` (dtype) and
    ``Ainv [B, T, H, C]`` (float32, for checking the solve alone)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    n = C // block

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        beta: T.Tensor([B, S, H], ACCUM),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        Ainv: T.Tensor([B, S, H, C], ACCUM),
    ):
        with T.Kernel(T.ceildiv(S, C), B * H, threads=threads) as (c, bbh):
            bb, bh, t0 = bbh // H, bbh % H, c * C
            L = T.min(C, S - t0)
            K_s = T.alloc_shared([C, DK], dtype)
            V_s = T.alloc_shared([C, DV], dtype)
            beta_s = T.alloc_shared([C], ACCUM)
            Kb_s = T.alloc_shared([C, DK], dtype)          # diag(b) K
            Vb_s = T.alloc_shared([C, DV], dtype)          # diag(b) V
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            X_s = T.alloc_shared([n - 1, block, block], ACCUM)
            Tcast_s = T.alloc_shared([C, C], dtype)
            KK = T.alloc_fragment([C, C], ACCUM)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, DV], ACCUM)

            T.copy(K[bb, t0:t0 + C, bh, :], K_s)
            T.copy(V[bb, t0:t0 + C, bh, :], V_s)
            for i in T.Parallel(C):                        # padding rows: b = 0, nothing written
                beta_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
            T.gemm(K_s, K_s, KK, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                A_s[i, j] = KK[i, j] * beta_s[i] * T.if_then_else(j < i, 1.0, 0.0)
            solve_unit_lower(A_s, Tinv_s, X_s, C, block)
            T.copy(Tinv_s, Ainv[bb, t0:t0 + C, bh, :])
            for i, j in T.Parallel(C, C):
                Tcast_s[i, j] = Tinv_s[i, j]
            for i, d in T.Parallel(C, DK):
                Kb_s[i, d] = K_s[i, d] * beta_s[i]
            for i, d in T.Parallel(C, DV):
                Vb_s[i, d] = V_s[i, d] * beta_s[i]
            T.gemm(Tcast_s, Kb_s, W_f, clear_accum=True)
            T.gemm(Tcast_s, Vb_s, U_f, clear_accum=True)
            T.copy(W_f, W[bb, t0:t0 + C, bh, :])
            T.copy(U_f, U[bb, t0:t0 + C, bh, :])

    return main
# --8<-- [end:chunk_wy]


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
        with T.Kernel(T.ceildiv(DV, block_dv), B * H, threads=threads) as (bv, bbh):
            bb, bh, dv0 = bbh // H, bbh % H, bv * block_dv
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

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        h: T.Tensor([B, NC, H, DK, DV], dtype),
        V_new: T.Tensor([B, S, H, DV], dtype),
        scale: T.float32,
        O: T.Tensor([B, S, H, DV], dtype),
    ):
        with T.Kernel(T.ceildiv(DV, block_dv), NC, B * H, threads=threads) as (bv, c, bbh):
            bb, bh, dv0, t0 = bbh // H, bbh % H, bv * block_dv, c * C
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
                QK[i, j] = QK[i, j] * T.if_then_else(j <= i, 1.0, 0.0)
            T.copy(QK, QK_cast)
            T.gemm(QK_cast, Vn_s, acc)
            for i, j in T.Parallel(C, block_dv):
                O_s[i, j] = acc[i, j] * scale
            T.copy(O_s, O[bb, t0:t0 + C, bh, dv0:dv0 + block_dv])

    return main
# --8<-- [end:chunk_output]
