import math
import tilelang.language as T
ACCUM='float32'
def scalar_variant(DK, DV, skip=(), chunk_size=64, block_dv=32, num_stages=3, threads=128,
                       dtype="bfloat16", with_state=False):
    """Scalar gate. Arguments at run time: ``Q, K, V, G [B, H, T_pad]`` (``chunk_cumsum``),
    ``scale`` (+ ``h0``), then ``O`` (+ ``ht``). Level 2's three weight places with
    ``a^(i-j)`` replaced by ``2^(G_i - G_j)``: the intra table is per chunk now."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NV = T.ceildiv(DV, block_dv)

    @T.macro
    def chunk_loop(Q, K, V, G, O, scale, S_f, bb, bh, dv0):
        Q_s = T.alloc_shared([C, DK], dtype)
        K_s = T.alloc_shared([C, DK], dtype)
        V_s = T.alloc_shared([C, block_dv], dtype)
        G_s = T.alloc_shared([C], ACCUM)
        Vw_s = T.alloc_shared([C, block_dv], dtype)       # V rows weighted by 2^(G_last - G_r)
        S_s = T.alloc_shared([DK, block_dv], dtype)
        O_s = T.alloc_shared([C, block_dv], dtype)
        w_query = T.alloc_shared([C], ACCUM)              # scale * 2^G_i
        acc_o = T.alloc_fragment([C, block_dv], ACCUM)
        A = T.alloc_fragment([C, C], ACCUM)
        A_cast = T.alloc_fragment([C, C], dtype)
        g_last = T.alloc_local([1], ACCUM)

        for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
            L = T.min(C, S - c * C)
            T.copy(Q[bb, c * C:(c + 1) * C, bh, :], Q_s)
            T.copy(K[bb, c * C:(c + 1) * C, bh, :], K_s)
            T.copy(V[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], V_s)
            T.copy(G[bb, bh, c * C:(c + 1) * C], G_s)
            T.copy(S_f, S_s)                               # the state before this chunk
            g_last[0] = G_s[L - 1]
            if "wq" not in skip:
                for i in T.Parallel(C):
                    w_query[i] = scale * T.exp2(G_s[i])
            if "sdec" not in skip:
                for i, j in T.Parallel(DK, block_dv):          # S = 2^G_last S
                    S_f[i, j] = S_f[i, j] * T.exp2(g_last[0])
            if "vw" in skip:
                for r, j in T.Parallel(C, block_dv):
                    Vw_s[r, j] = V_s[r, j]
            else:
                for r, j in T.Parallel(C, block_dv):           # keys decayed to the chunk end,
                    Vw_s[r, j] = T.if_then_else(               # applied to the value rows
                        r < L, V_s[r, j] * T.exp2(g_last[0] - G_s[r]), 0.0)
            T.gemm(K_s, Vw_s, S_f, transpose_A=True, annotations={"wg_wait": -1})
            T.gemm(Q_s, S_s, acc_o, clear_accum=True, annotations={"wg_wait": -1})
            T.gemm(Q_s, K_s, A, transpose_B=True, clear_accum=True)
            if "wq" not in skip:
                for i, j in T.Parallel(C, block_dv):
                    acc_o[i, j] = acc_o[i, j] * w_query[i]
            if "expA" in skip:
                for i, j in T.Parallel(C, C):
                    A[i, j] = T.if_then_else(j <= i, A[i, j] * scale, 0.0)
            else:
                for i, j in T.Parallel(C, C):                  # exp2 only where j <= i
                    A[i, j] = T.if_then_else(j <= i, A[i, j] * scale * T.exp2(G_s[i] - G_s[j]), 0.0)
            T.copy(A, A_cast)
            T.gemm(A_cast, V_s, acc_o)
            T.copy(acc_o, O_s)
            T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])

    if not with_state:
        @T.prim_func
        def main(
            Q: T.Tensor([B, S, H, DK], dtype),
            K: T.Tensor([B, S, H, DK], dtype),
            V: T.Tensor([B, S, H, DV], dtype),
            G: T.Tensor([B, H, T.ceildiv(S, C) * C], ACCUM),
            scale: T.float32,
            O: T.Tensor([B, S, H, DV], dtype),
        ):
            with T.Kernel(NV, B * H, threads=threads) as (bv, bbh):
                S_f = T.alloc_fragment([DK, block_dv], ACCUM)
                T.clear(S_f)
                chunk_loop(Q, K, V, G, O, scale, S_f, bbh // H, bbh % H, bv * block_dv)
    else:
        @T.prim_func
        def main(
            Q: T.Tensor([B, S, H, DK], dtype),
            K: T.Tensor([B, S, H, DK], dtype),
            V: T.Tensor([B, S, H, DV], dtype),
            G: T.Tensor([B, H, T.ceildiv(S, C) * C], ACCUM),
            scale: T.float32,
            h0: T.Tensor([B, H, DK, DV], ACCUM),
            O: T.Tensor([B, S, H, DV], dtype),
            ht: T.Tensor([B, H, DK, DV], ACCUM),
        ):
            with T.Kernel(NV, B * H, threads=threads) as (bv, bbh):
                bb, bh, dv0 = bbh // H, bbh % H, bv * block_dv
                S_f = T.alloc_fragment([DK, block_dv], ACCUM)
                T.copy(h0[bb, bh, :, dv0:dv0 + block_dv], S_f)
                chunk_loop(Q, K, V, G, O, scale, S_f, bb, bh, dv0)
                T.copy(S_f, ht[bb, bh, :, dv0:dv0 + block_dv])

    return main
