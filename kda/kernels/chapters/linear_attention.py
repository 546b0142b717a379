"""Level 1 TileLang kernels: ``S <- S + k v^T``, ``o = S^T q``.

Two kernels for the same function:

* ``seq_in_grid``: the teaching kernel. The grid is (chunks, heads, batch); every block
  rebuilds the prefix state of its own chunk from scratch, so the state-update GEMMs grow
  as ``NC (NC - 1) / 2``. Mirrors ``kda.reference.level1.seq_in_grid``.
* ``seq_in_loop``: the fused kernel. The grid is (value stripes, heads, batch); the
  chunks are a loop inside the block and the state ``[DK, block_dv]`` stays in registers.
  Mirrors ``kda.reference.level1.seq_in_loop``.

Inputs are fp16 or bf16 ``[B, T, H, D]`` with any ``B`` and ``T`` (both are symbolic, so
one compiled kernel serves every length; TMA loads zero-fill a short last chunk and TMA
stores clip it). Accumulation is fp32.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.stages import ACCUM, load_state, state_shape, store_state



# --8<-- [start:seq_in_grid]
def seq_in_grid(DK, DV, chunk_size=64, num_stages=2, threads=128, dtype="float16",
                own_chunk_buffers=True):
    """Teaching kernel; run-time arguments ``Q, K, V, O``.

    ``own_chunk_buffers=False`` is the article's version, which loads the block's own chunk
    back into the pipelined ``K_s``/``V_s``. With tilelang 0.1.15 on sm_90a that compiles
    only with ``num_stages <= 1``; with 2 the warp-specialisation pass stops at
    "Versioned buffer load escaped pipeline stage context".
    """
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        O: T.Tensor([B, S, H, DV], dtype),
    ):
        with T.Kernel(T.ceildiv(S, C), H, B, threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared([C, DK], dtype)
            K_s = T.alloc_shared([C, DK], dtype)        # streamed by the pipeline
            V_s = T.alloc_shared([C, DV], dtype)
            if own_chunk_buffers:
                K_cur = T.alloc_shared([C, DK], dtype)  # the block's own chunk
                V_cur = T.alloc_shared([C, DV], dtype)
            else:
                K_cur, V_cur = K_s, V_s                 # as in the article
            S_s = T.alloc_shared([DK, DV], dtype)       # state cast down to feed the MMA
            O_s = T.alloc_shared([C, DV], dtype)
            S_f = T.alloc_fragment([DK, DV], ACCUM)
            acc_o = T.alloc_fragment([C, DV], ACCUM)
            A = T.alloc_fragment([C, C], ACCUM)
            A_cast = T.alloc_fragment([C, C], dtype)

            # (1) prefix state of chunk bx, rebuilt from zero: bx GEMMs for block bx
            T.clear(S_f)
            for c in T.Pipelined(bx, num_stages=num_stages):
                T.copy(K[bz, c * C:(c + 1) * C, by, :], K_s)
                T.copy(V[bz, c * C:(c + 1) * C, by, :], V_s)
                T.gemm(K_s, V_s, S_f, transpose_A=True)
            T.copy(S_f, S_s)

            # (2) inter-chunk term: O = Q_c S_prev
            T.copy(Q[bz, bx * C:(bx + 1) * C, by, :], Q_s)
            T.gemm(Q_s, S_s, acc_o, clear_accum=True)

            # (3) intra-chunk term: O += tril(Q_c K_c^T) V_c. The pipelined K_s/V_s are
            # multi-buffered (one copy per stage), so the chunk goes to K_cur/V_cur.
            T.copy(K[bz, bx * C:(bx + 1) * C, by, :], K_cur)
            T.copy(V[bz, bx * C:(bx + 1) * C, by, :], V_cur)
            T.gemm(Q_s, K_cur, A, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                A[i, j] = T.if_then_else(j <= i, A[i, j], 0.0)   # no exp: mask by zero
            T.copy(A, A_cast)
            T.gemm(A_cast, V_cur, acc_o)

            T.copy(acc_o, O_s)
            T.copy(O_s, O[bz, bx * C:(bx + 1) * C, by, :])

    return main
# --8<-- [end:seq_in_grid]


# --8<-- [start:seq_in_loop]
def seq_in_loop(DK, DV, chunk_size=64, block_dv=32, num_stages=3, threads=128,
                dtype="bfloat16", initial_state=False, final_state=False, overlap_gemms=True):
    """Fused forward. Arguments at run time: ``Q, K, V, scale, h0``, then the outputs ``O`` and
    ``ht`` (the fp32 final state ``[B, H, DK, DV]``). Without ``initial_state`` the state starts
    at zero and without ``final_state`` none is written; ``h0``/``ht`` are then ``[1, 1, 1, 1]``
    stand-ins (``kda.kernels.stages.state_shape``).

    ``overlap_gemms=False`` keeps the article's order: read-out, intra term, write-back,
    then the state update, each GEMM waited for before the next starts.
    """
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NV = T.ceildiv(DV, block_dv)

    @T.macro
    def chunk_loop(Q, K, V, O, scale, S_f, bb, bh, dv0):
        Q_s = T.alloc_shared([C, DK], dtype)
        K_s = T.alloc_shared([C, DK], dtype)
        V_s = T.alloc_shared([C, block_dv], dtype)
        S_s = T.alloc_shared([DK, block_dv], dtype)
        O_s = T.alloc_shared([C, block_dv], dtype)
        acc_o = T.alloc_fragment([C, block_dv], ACCUM)
        A = T.alloc_fragment([C, C], ACCUM)
        A_cast = T.alloc_fragment([C, C], dtype)

        for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
            T.copy(Q[bb, c * C:(c + 1) * C, bh, :], Q_s)
            T.copy(K[bb, c * C:(c + 1) * C, bh, :], K_s)
            T.copy(V[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], V_s)
            # the read-out uses the state *before* this chunk: snapshot it (cast down)
            T.copy(S_f, S_s)
            if overlap_gemms:
                # S_s already holds the old state, so the state update need not wait for
                # the write-back: issue the three GEMMs together and wait once
                # Only the last GEMM waits (for all three). It must be one that reads Q_s
                # and K_s: tilelang 0.1.15 hands a pipelined buffer back to the producer
                # right after its last GEMM is issued, waited for or not.
                T.gemm(K_s, V_s, S_f, transpose_A=True, annotations={"wg_wait": -1})
                T.gemm(Q_s, S_s, acc_o, clear_accum=True, annotations={"wg_wait": -1})
                T.gemm(Q_s, K_s, A, transpose_B=True, clear_accum=True)
            else:
                T.gemm(Q_s, S_s, acc_o, clear_accum=True)
                T.gemm(Q_s, K_s, A, transpose_B=True, clear_accum=True)
            # intra-chunk term; the block holds all of DK, so Q K^T is complete here
            for i, j in T.Parallel(C, C):
                A[i, j] = T.if_then_else(j <= i, A[i, j], 0.0)
            T.copy(A, A_cast)
            T.gemm(A_cast, V_s, acc_o)
            for i, j in T.Parallel(C, block_dv):
                acc_o[i, j] = acc_o[i, j] * scale
            T.copy(acc_o, O_s)
            T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])
            if not overlap_gemms:
                # state update after the write-back: the exclusive prefix ("shift right")
                T.gemm(K_s, V_s, S_f, transpose_A=True)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        scale: T.float32,
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(NV, H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)       # loop-carried state
            load_state(h0, S_f, bb, bh, dv0, initial_state)
            chunk_loop(Q, K, V, O, scale, S_f, bb, bh, dv0)
            store_state(S_f, ht, bb, bh, dv0, final_state)

    return main
# --8<-- [end:seq_in_loop]
