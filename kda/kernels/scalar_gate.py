"""GDN's path (one gate per token and head): the chunk's inverse apart from a pass that forms the rest.

With a scalar gate the decay factors out of the chunk's matrix, so every product the state and the
output need can be made from the raw ``q, k, v`` and one ``C x C`` matrix per chunk:

1. ``chunk_gated_inverse``, every chunk at once (several per block, the next one's loads in
   flight): the gate's chunk-local cumsum ``G`` (log2 units, head-major ``[B, H, T_pad]``, checked as
   it is read) and ``Tb = (I + strict(diag(b) (K K^T * 2^(G_i - G_j))))^-1 diag(b)``, the gated
   inverse with ``b`` folded in (``[B, T, H, C]`` in the inputs' dtype). Every factor is ``2^x`` with
   ``x <= 0``, so it is exact for any gate ``<= 0``, runs of -20 included.
2. ``inverse_state_output_pass``, sequential over the chunks: ``V_new = Tb (V - 2^G (K S))`` (the
   delta rule's corrected values without forming ``W`` or ``U``), the output ``scale (2^G (Q S) +
   causal(Q K^T 2^(G_i - G_j)) V_new)`` and ``S <- 2^G_last S + K^T (2^(G_last - G) V_new)``.

Level 5's GDN form (``chunk_intra``'s scalar path, then ``gated_state_output_pass``) writes
``Qw, Kw, W, U`` and ``A_qk`` to HBM for its pass; this one writes ``Tb`` and ``G`` only, and pays for
it by forming ``K S`` and ``Q K^T`` once per value block inside the pass. It wins where the pass can
take wide value blocks (many heads or sequences): runs 53-56 in results/tuning. Mirrors
``kda.reference.level0.scalar_gate_chunked``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.build import WARP_SPECIALISED
from kda.kernels.stages import (ACCUM, decay_factor, invert_diagonal_blocks_by_columns, load_beta_checked,
                                load_state, log2_cumsum_by_columns, merge_by_substitution, real, state_shape,
                                store_state)


# --8<-- [start:chunk_gated_inverse]
def chunk_gated_inverse(DK, chunk_size=64, block=16, dtype="bfloat16", gate_dtype="float32", value_groups=1,
                        threads=128, chunks_per_block=8, num_stages=2):
    """Arguments at run time: ``K [B, T, HQ, DK]``, ``g [B, T, H]`` (``gate_dtype``, natural log),
    ``beta [B, T, H]`` (float32), then the outputs ``G [B, H, T_pad]`` (float32, ``T_pad`` the length
    rounded up to whole chunks; flat past the end), ``Tb [B, T, H, C]`` (dtype; zero above the diagonal
    and in the columns past the end) and ``flags [2]`` (int32, zeroed by the caller: ``flags[0]`` a gate
    not finite and ``<= 0``, ``flags[1]`` a ``b`` outside ``[0, 1]``). ``H = value_groups HQ``: value head
    ``h`` reads key head ``h // value_groups``. The solve is level 4's (``chunk_wy``): the diagonal
    blocks by columns, then block substitution; ``chunks_per_block`` chunks of one head per block."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    HQ = T.dynamic("HQ")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        K: T.Tensor([B, S, HQ, DK], dtype),
        g: T.Tensor([B, S, H], gate_dtype),
        beta: T.Tensor([B, S, H], ACCUM),
        G: T.Tensor([B, H, T.ceildiv(S, C) * C], ACCUM),
        Tb: T.Tensor([B, S, H, C], dtype),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(T.ceildiv(NC, chunks_per_block), H, B, threads=threads) as (cb, bh, bb):
            K_s = T.alloc_shared([C, DK], dtype)
            G_s = T.alloc_shared([C, 1], ACCUM)               # the gate, then its cumsum in place
            beta_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            KK = T.alloc_fragment([C, C], ACCUM)
            x_col = T.alloc_local([block], ACCUM)
            hq = bh // value_groups if value_groups > 1 else bh
            c0 = cb * chunks_per_block
            for ci in T.Pipelined(T.min(chunks_per_block, NC - c0), num_stages=num_stages):
                t0 = (c0 + ci) * C
                L = T.min(C, S - t0)
                T.copy(K[bb, t0:t0 + C, hq, :], K_s)
                load_beta_checked(beta, beta_s, flags, t0, L, C, bb, bh)
                for i in T.Parallel(C):
                    G_s[i, 0] = T.Cast(ACCUM, g[bb, t0 + T.min(i, L - 1), bh])
                log2_cumsum_by_columns(G_s, G_s, L, C, 1, flags)
                for i in T.Parallel(C):
                    G[bb, bh, t0 + i] = G_s[i, 0]
                T.gemm(K_s, K_s, KK, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):       # rows past the end: b = 0
                    A_s[i, j] = KK[i, j] * beta_s[i] * decay_factor(G_s[i, 0] - G_s[j, 0]) * real(j < i)
                invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, block)
                merge_by_substitution(A_s, Tinv_s, C, block)
                for i, j in T.Parallel(C, C):       # the blocks above the diagonal were never written
                    Tb_s[i, j] = T.if_then_else(i // block >= j // block, Tinv_s[i, j] * beta_s[j], 0.0)
                T.copy(Tb_s, Tb[bb, t0:t0 + C, bh, :])

    return main
# --8<-- [end:chunk_gated_inverse]


# --8<-- [start:inverse_state_output_pass]
def inverse_state_output_pass(DK, DV, chunk_size=64, block_dv=128, dtype="bfloat16", value_groups=1,
                              initial_state=False, final_state=False, registers=(160, 128, 128, 40)):
    """Arguments at run time: ``Q, K [B, T, HQ, DK]``, ``V [B, T, H, DV]``, ``Tb [B, T, H, C]`` and
    ``G [B, H, T_pad]`` of ``chunk_gated_inverse``, ``scale``, ``h0``, then ``O [B, T, H, DV]`` (dtype)
    and ``ht`` (the state flags as in ``kda.kernels.level1.seq_in_loop``).

    One block per (value block, head, sequence), 512 threads, warp-specialised by hand:

    * warpgroup 0, the chain: ``S`` to shared memory (bf16) for the others, ``S <- 2^G_last S``, then
      ``+ K^T V'`` once warpgroup 1 has ``V'``;
    * warpgroup 1: ``X = V - 2^G (K S)`` (over ``V``'s slot), ``V_new = Tb X``, ``V' = 2^(G_last - G)
      V_new`` for the chain and ``V_new`` for the output;
    * warpgroup 2, the output: ``P = causal(scale Q K^T 2^(G_i - G_j))`` before the state is needed,
      then ``scale 2^G (Q S) + P V_new``;
    * one producer warp: ``q, k, v, Tb`` of the next chunk by TMA into the second of two slots, and
      ``2^G``, ``2^(G_last - G)`` once per row (the consumers read them instead of an ``exp2`` per
      element: run 54).

    Rows past the end load as zeros and ``G`` is flat there, so the last chunk needs no mask.
    ``registers``: ``setmaxnreg`` of the four warpgroups (the chain holds ``S``: ``DK x block_dv``
    float32 over 128 threads)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    HQ = T.dynamic("HQ")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)

    @T.macro
    def chain(k_s, E_s, vn_s, S_s, S_f, data_ready, data_free, s_ready, s_free, vn_ready, h0, ht, bb, bh, dv0):
        load_state(h0, S_f, bb, bh, dv0, initial_state)
        for c in T.serial(NC):
            slot = c % 2
            T.barrier_wait(data_ready[slot], (c // 2) % 2)
            T.barrier_wait(s_free, (c + 1) % 2)                   # both readers are done with chunk c - 1's
            T.copy(S_f, S_s)
            T.fence_proxy_async()
            T.barrier_arrive(s_ready)
            for i, j in T.Parallel(DK, BV):
                S_f[i, j] = S_f[i, j] * E_s[slot, C - 1]
            T.barrier_wait(vn_ready, c % 2)
            T.gemm(k_s[slot, :, :], vn_s, S_f, transpose_A=True)
            T.barrier_arrive(data_free[slot])
        store_state(S_f, ht, bb, bh, dv0, final_state)

    @T.macro
    def corrected_values(k_s, v_s, tb_s, E_s, R_s, S_s, vd_s, vn_s, KS, VD, data_ready, data_free, s_ready,
                         s_free, vn_ready, vd_ready, vd_free):
        for c in T.serial(NC):
            slot = c % 2
            T.barrier_wait(data_ready[slot], (c // 2) % 2)
            T.barrier_wait(s_ready, c % 2)
            T.gemm(k_s[slot, :, :], S_s, KS, clear_accum=True)
            T.barrier_arrive(s_free)
            for i, j in T.Parallel(C, BV):
                v_s[slot, i, j] = v_s[slot, i, j] - E_s[slot, i] * KS[i, j]
            T.fence_proxy_async()
            T.gemm(tb_s[slot, :, :], v_s[slot, :, :], VD, clear_accum=True)
            for i, j in T.Parallel(C, BV):
                vn_s[i, j] = VD[i, j] * R_s[slot, i]
            T.fence_proxy_async()
            T.barrier_arrive(vn_ready)
            T.barrier_wait(vd_free, (c + 1) % 2)
            T.copy(VD, vd_s)
            T.fence_proxy_async()
            T.barrier_arrive(vd_ready)
            T.barrier_arrive(data_free[slot])

    @T.macro
    def output(q_s, k_s, G_s, E_s, S_s, vd_s, p_s, o_s, P_f, O_f, data_ready, data_free, s_ready, s_free,
               vd_ready, vd_free, scale, O, bb, bh, dv0):
        for c in T.serial(NC):
            slot = c % 2
            T.barrier_wait(data_ready[slot], (c // 2) % 2)
            T.gemm(q_s[slot, :, :], k_s[slot, :, :], P_f, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                p_s[i, j] = P_f[i, j] * decay_factor(G_s[slot, i] - G_s[slot, j]) * T.if_then_else(j <= i, scale, 0.0)
            T.fence_proxy_async()
            T.barrier_wait(s_ready, c % 2)
            T.gemm(q_s[slot, :, :], S_s, O_f, clear_accum=True)
            T.barrier_arrive(s_free)
            for i, j in T.Parallel(C, BV):
                O_f[i, j] = O_f[i, j] * (scale * E_s[slot, i])
            T.barrier_wait(vd_ready, c % 2)
            T.gemm(p_s, vd_s, O_f)
            T.barrier_arrive(vd_free)
            T.barrier_arrive(data_free[slot])
            T.copy(O_f, o_s)
            T.copy(o_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])

    @T.macro
    def load_chunks(Q, K, V, Tb, G, q_s, k_s, v_s, tb_s, G_s, E_s, R_s, data_ready, data_free, lane, bb, bh, hq,
                    dv0):
        for c in T.serial(NC):
            slot = c % 2
            T.barrier_wait(data_free[slot], (c // 2 + 1) % 2)
            rows = slice(c * C, (c + 1) * C)
            T.tma_copy(Q[bb, rows, hq, :], q_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(K[bb, rows, hq, :], k_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], v_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(Tb[bb, rows, bh, :], tb_s[slot, :, :], barrier=data_ready[slot])
            g_last = G[bb, bh, c * C + C - 1]
            for r in T.unroll(C // 32):                            # the warp's 32 lanes, C rows
                i = lane + 32 * r
                G_s[slot, i] = G[bb, bh, c * C + i]
                E_s[slot, i] = T.exp2(G[bb, bh, c * C + i])
                R_s[slot, i] = T.exp2(g_last - G[bb, bh, c * C + i])
            T.barrier_arrive(data_ready[slot])

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, HQ, DK], dtype),
        K: T.Tensor([B, S, HQ, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        Tb: T.Tensor([B, S, H, C], dtype),
        G: T.Tensor([B, H, T.ceildiv(S, C) * C], ACCUM),
        scale: T.float32,
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=512) as (bv, bh, bb):
            dv0 = bv * BV
            hq = bh // value_groups if value_groups > 1 else bh
            q_s = T.alloc_shared([2, C, DK], dtype)          # two slots: chunk c in slot c % 2
            k_s = T.alloc_shared([2, C, DK], dtype)
            v_s = T.alloc_shared([2, C, BV], dtype)          # V, then X = V - 2^G K S
            tb_s = T.alloc_shared([2, C, C], dtype)
            G_s = T.alloc_shared([2, C], ACCUM)
            E_s = T.alloc_shared([2, C], ACCUM)              # 2^G
            R_s = T.alloc_shared([2, C], ACCUM)              # 2^(G_last - G)
            S_s = T.alloc_shared([DK, BV], dtype)
            vd_s = T.alloc_shared([C, BV], dtype)            # V_new, for the output
            vn_s = T.alloc_shared([C, BV], dtype)            # V' = 2^(G_last - G) V_new, for the chain
            p_s = T.alloc_shared([C, C], dtype)
            o_s = T.alloc_shared([C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            KS = T.alloc_fragment([C, BV], ACCUM)
            VD = T.alloc_fragment([C, BV], ACCUM)
            P_f = T.alloc_fragment([C, C], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[384, 384])     # the three warpgroups
            s_ready = T.alloc_barrier(arrive_count=128)              # chain -> warpgroups 1, 2
            s_free = T.alloc_barrier(arrive_count=256)               # warpgroups 1, 2 -> chain
            vn_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> chain
            vd_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> output
            vd_free = T.alloc_barrier(arrive_count=128)              # output -> warpgroup 1
            tx = T.get_thread_binding()
            # one code branch per warpgroup; a wait for parity (c + 1) % 2 passes at c = 0
            if tx < 128:
                T.set_max_nreg(registers[0], 1)
                chain(k_s, E_s, vn_s, S_s, S_f, data_ready, data_free, s_ready, s_free, vn_ready, h0, ht, bb, bh,
                      dv0)
            elif tx < 256:
                T.set_max_nreg(registers[1], 1)
                corrected_values(k_s, v_s, tb_s, E_s, R_s, S_s, vd_s, vn_s, KS, VD, data_ready, data_free, s_ready,
                                 s_free, vn_ready, vd_ready, vd_free)
            elif tx < 384:
                T.set_max_nreg(registers[2], 1)
                output(q_s, k_s, G_s, E_s, S_s, vd_s, p_s, o_s, P_f, O_f, data_ready, data_free, s_ready, s_free,
                       vd_ready, vd_free, scale, O, bb, bh, dv0)
            else:
                T.set_max_nreg(registers[3], 0)
                if tx < 416:
                    load_chunks(Q, K, V, Tb, G, q_s, k_s, v_s, tb_s, G_s, E_s, R_s, data_ready, data_free, tx - 384,
                                bb, bh, hq, dv0)

    return main


# Warpgroups run their branches at once: no two shared buffers may share bytes (build.WARP_SPECIALISED).
inverse_state_output_pass.pass_configs = WARP_SPECIALISED
# --8<-- [end:inverse_state_output_pass]
