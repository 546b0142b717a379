"""The warp-specialised sequential pass of linear attention with at most one gate per head.

What ``kda.linear_attention``, ``kda.decay_attention``, ``kda.gated_attention`` with a gate per head
and ``kda.delta_rule`` run (the last after ``kernels.wy_solve.chunk_wy``): one block per value
stripe, head and sequence, the chunks a loop inside it, the state in the registers of one
warpgroup while others form the chunk's output beside it.

Every weight is ``exp2`` of a difference of chunk-local cumulative gates ``G`` (log2 units,
``G = cumsum(g) / ln 2`` inside each chunk) taken so that the argument is never positive.

* ``chunk_cumsum``: ``g [B, T, H, D]`` (``D = 1`` for a scalar gate) -> ``G [B, H, T_pad, D]``
  float32, each chunk contiguous for the kernels that read it, and a flag for a gate out of
  range (the value check costs no read of ``g`` of its own).
* ``seq_in_loop_scalar``: the pass; its gate is none (level 1), a constant per head (level 2) or
  read from ``G`` (level 3), and ``delta`` adds the delta rule's chain (level 4).
* ``state_output_pass``: the delta rule's form of it, no gate.

Mirrors ``kda.reference.level3`` (``kernel_mimic``) and ``kda.reference.level4``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch

from kda import launch
from kda.chunking import ceildiv
from kda.kernels.build import WARP_SPECIALISED
from kda.kernels.stages import (ACCUM, decay_factor, load_state, log2_cumsum_by_columns, real, state_shape,
                                store_state)


# --8<-- [start:cumsum]
def chunk_cumsum(D, chunk_size=64, gate_dtype="float32", threads=128):
    """``g [B, T, H, D]`` -> chunk-local cumulative gates in log2 units, ``G [B, H, T_pad, D]``
    with ``T_pad`` the length rounded up to whole chunks (TMA wants 16-byte row strides);
    ``flags[0] = 1`` where a gate is not finite and ``<= 0`` (``flags`` int32 ``[2]``, zeroed by
    the caller; ``flags[1]`` is level 5's, for ``beta``). Rows past the end count as 0, so ``G``
    stays flat over the padding of a tail chunk."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size

    @T.prim_func
    def main(
        g: T.Tensor([B, S, H, D], gate_dtype),
        G: T.Tensor([B, H, T.ceildiv(S, C) * C, D], ACCUM),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(T.ceildiv(S, C), H, B, threads=threads) as (c, bh, bb):
            g_s = T.alloc_shared([C, D], gate_dtype)
            G_s = T.alloc_shared([C, D], ACCUM)
            T.copy(g[bb, c * C:(c + 1) * C, bh, :], g_s)
            log2_cumsum_by_columns(g_s, G_s, T.min(C, S - c * C), C, D, flags)
            T.copy(G_s, G[bb, bh, c * C:(c + 1) * C, :])

    return main
# --8<-- [end:cumsum]


# --8<-- [start:seq_in_loop_scalar]
def seq_in_loop_scalar(DK, DV, chunk_size=64, block_dv=32, slots=4, out_groups=2, dtype="bfloat16",
                       gate="per_token", delta=False, initial_state=False, final_state=False):
    """The fused sequential pass of levels 2 to 4, at most one gate per token and head (a scalar gate).
    Arguments at run time: ``Q, K, V [B, T, H, *]``, ``W`` (with ``delta``, else a ``[1, 1, 1, 1]``
    stand-in), ``G``, ``scale, h0``, then ``O, ht`` (the state flags as in level 1). Level 2's three
    weight places with ``a^(i-j)`` replaced by ``2^(G_i - G_j)``.

    ``gate``: ``"per_token"``, ``G [B, H, T_pad]`` from ``chunk_cumsum``; ``"constant"``, level 2's
    operation, ``G [H]`` holds ``log2 a`` per head and ``G_i = (i + 1) log2 a`` comes from a register
    (``kda.decay_attention``, run 67 in results/tuning); ``"none"``, no decay (``G`` a ``[1]``
    stand-in). ``delta``: the delta rule's chain (level 4's ``state_output_pass``): ``V`` holds ``U``,
    and the chain forms ``V_new = U - W S`` before the update, which the output then multiplies its
    scores by instead of ``V``.

    Warp-specialised by hand, as level 5's state pass: warpgroup 0 carries the state's chain
    (``S`` to shared memory for the output, ``V_new`` with ``delta``, then ``S <- 2^G_last S + K^T
    (V 2^(G_last - G))``); ``out_groups`` output warpgroups (1 or 2, taking alternate chunks) form
    ``Q K^T`` and its decay before the chunk's state is needed, then ``Q S`` times ``scale 2^G_i``,
    ``+ A V``, the store; one producer warp loads q, k, the value columns, ``W`` and ``G`` by TMA into
    ``slots`` chunk slots. ``S`` and ``V_new`` go through two slots of their own, so that the chain
    can run a chunk ahead of the output."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)
    assert out_groups in (1, 2), "one or two output warpgroups"
    assert gate in ("per_token", "constant", "none")
    decayed = gate != "none"

    def cum_gate(G_s, slot, i):
        """``G_i`` of the chunk in ``slot``: loaded, or ``(i + 1) log2 a`` with a constant decay."""
        return (i + 1) * G_s[0] if gate == "constant" else G_s[slot, i]

    def weighted_score(x, G_s, slot, i, j, scale):
        """The score ``x = (Q K^T)_ij`` times the decay ``2^(G_i - G_j)``, the causal mask and ``scale``;
        without a gate the mask alone (``scale`` then multiplies the output once, as level 4 did)."""
        if not decayed:
            return x * real(j <= i)
        return x * decay_factor(cum_gate(G_s, slot, i) - cum_gate(G_s, slot, j)) * T.if_then_else(j <= i, scale, 0.0)

    @T.macro
    def state_chain(K_s, V_s, W_s, G_s, S_s, Vn_s, Vw_s, S_f, WS, g_last, data_ready, data_free, s_ready, s_free,
                    vn_ready, vn_free, h0, ht, bb, bh, dv0):
        load_state(h0, S_f, bb, bh, dv0, initial_state)
        for c in T.serial(NC):
            slot = c % slots
            L = T.min(C, S - c * C)
            T.barrier_wait(data_ready[slot], (c // slots) % 2)
            T.barrier_wait(s_free[c % 2], (c // 2 + 1) % 2)      # the output of chunk c - 2 has read it
            T.copy(S_f, S_s[c % 2, :, :])                          # the state before this chunk
            T.fence_proxy_async()
            T.barrier_arrive(s_ready[c % 2])
            if delta:                                              # V_new = U - W S, for both sides
                T.gemm(W_s[slot, :, :], S_s[c % 2, :, :], WS, clear_accum=True)
                T.barrier_wait(vn_free[c % 2], (c // 2 + 1) % 2)
                if decayed:
                    g_last[0] = cum_gate(G_s, slot, L - 1)
                for i, j in T.Parallel(C, BV):                     # rows past the end: 0 - 0 as loaded
                    Vn_s[c % 2, i, j] = V_s[slot, i, j] - WS[i, j]
                    if decayed:                    # weighted from the same registers: no read of Vn_s
                        Vw_s[i, j] = (V_s[slot, i, j] - WS[i, j]) * \
                            T.exp2(T.min(g_last[0] - cum_gate(G_s, slot, i), 0.0))
                T.fence_proxy_async()
                T.barrier_arrive(vn_ready[c % 2])
            if decayed:
                if not delta:
                    g_last[0] = cum_gate(G_s, slot, L - 1)
                for i, j in T.Parallel(DK, BV):                    # S = 2^G_last S
                    S_f[i, j] = S_f[i, j] * T.exp2(g_last[0])
                if not delta:
                    for r, j in T.Parallel(C, BV):  # keys decayed to the chunk end, on V rows (zeros past L)
                        Vw_s[r, j] = V_s[slot, r, j] * T.exp2(T.min(g_last[0] - cum_gate(G_s, slot, r), 0.0))
                T.fence_proxy_async()
                T.gemm(K_s[slot, :, :], Vw_s, S_f, transpose_A=True)
            else:
                if delta:
                    T.gemm(K_s[slot, :, :], Vn_s[c % 2, :, :], S_f, transpose_A=True)
                else:
                    T.gemm(K_s[slot, :, :], V_s[slot, :, :], S_f, transpose_A=True)
            T.barrier_arrive(data_free[slot])
        store_state(S_f, ht, bb, bh, dv0, final_state)

    @T.macro
    def output_chunks(w, Q_s, K_s, V_s, G_s, S_s, Vn_s, O_s, acc_o, A, A_cast, data_ready, data_free, s_ready,
                      s_free, vn_ready, vn_free, scale, O, bb, bh, dv0):
        for cc in T.serial(T.ceildiv(NC - w, out_groups)):
            c = cc * out_groups + w
            slot = c % slots
            T.barrier_wait(data_ready[slot], (c // slots) % 2)
            T.gemm(Q_s[slot, :, :], K_s[slot, :, :], A, transpose_B=True, clear_accum=True)
            if decayed:
                for i, j in T.Parallel(C, C):
                    A[i, j] = weighted_score(A[i, j], G_s, slot, i, j, scale)
                T.copy(A, A_cast)
            else:                                                  # the mask is exact: cast in the same pass
                for i, j in T.Parallel(C, C):
                    A_cast[i, j] = weighted_score(A[i, j], G_s, slot, i, j, scale)
            T.barrier_wait(s_ready[c % 2], (c // 2) % 2)
            T.gemm(Q_s[slot, :, :], S_s[c % 2, :, :], acc_o, clear_accum=True)
            T.barrier_arrive(s_free[c % 2])
            if decayed:
                for i, j in T.Parallel(C, BV):
                    acc_o[i, j] = acc_o[i, j] * (scale * T.exp2(cum_gate(G_s, slot, i)))
            if delta:
                T.barrier_wait(vn_ready[c % 2], (c // 2) % 2)
                T.gemm(A_cast, Vn_s[c % 2, :, :], acc_o)
                T.barrier_arrive(vn_free[c % 2])
            else:
                T.gemm(A_cast, V_s[slot, :, :], acc_o)
            T.barrier_arrive(data_free[slot])
            if decayed:
                T.copy(acc_o, O_s[w, :, :])
            else:
                for i, j in T.Parallel(C, BV):
                    O_s[w, i, j] = acc_o[i, j] * scale
            T.copy(O_s[w, :, :], O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])

    @T.macro
    def load_chunks(Q, K, V, W, G, Q_s, K_s, V_s, W_s, G_s, data_ready, data_free, bb, bh, dv0):
        for c in T.serial(NC):
            slot = c % slots
            T.barrier_wait(data_free[slot], (c // slots + 1) % 2)
            rows = slice(c * C, (c + 1) * C)
            T.tma_copy(Q[bb, rows, bh, :], Q_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(K[bb, rows, bh, :], K_s[slot, :, :], barrier=data_ready[slot])
            if delta:
                T.tma_copy(W[bb, rows, bh, :], W_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], V_s[slot, :, :], barrier=data_ready[slot])
            if gate == "per_token":
                T.tma_copy(G[bb, bh, rows], G_s[slot, :], barrier=data_ready[slot])
            T.barrier_arrive(data_ready[slot])

    g_shape = {"per_token": [B, H, T.ceildiv(S, C) * C], "constant": [H], "none": [1]}[gate]

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        W: T.Tensor([B, S, H, DK] if delta else [1, 1, 1, 1], dtype),
        G: T.Tensor(g_shape, ACCUM),
        scale: T.float32,
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=128 * (2 + out_groups)) as (bv, bh, bb):
            dv0 = bv * BV
            Q_s = T.alloc_shared([slots, C, DK], dtype)
            K_s = T.alloc_shared([slots, C, DK], dtype)
            V_s = T.alloc_shared([slots, C, BV], dtype)
            W_s = T.alloc_shared([slots if delta else 1, C, DK], dtype)
            if gate == "constant":
                G_s = T.alloc_local([1], ACCUM)                       # log2 a of this head
                G_s[0] = G[bh]
            else:
                G_s = T.alloc_shared([slots, C], ACCUM)
            S_s = T.alloc_shared([2, DK, BV], dtype)
            Vn_s = T.alloc_shared([2 if delta else 1, C, BV], dtype)
            Vw_s = T.alloc_shared([C, BV], dtype)
            O_s = T.alloc_shared([out_groups, C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            WS = T.alloc_fragment([C, BV], ACCUM)
            g_last = T.alloc_local([1], ACCUM)
            # one set of fragments per output warpgroup: a fragment's layout belongs to one warpgroup
            acc_o = T.alloc_fragment([C, BV], ACCUM)
            A = T.alloc_fragment([C, C], ACCUM)
            A_cast = T.alloc_fragment([C, C], dtype)
            acc_o_1 = T.alloc_fragment([C, BV], ACCUM)
            A_1 = T.alloc_fragment([C, C], ACCUM)
            A_cast_1 = T.alloc_fragment([C, C], dtype)
            data_ready = T.alloc_barrier(arrive_count=[32] * slots)    # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[256] * slots)    # the chain and one output group
            s_ready = T.alloc_barrier(arrive_count=[128, 128])
            s_free = T.alloc_barrier(arrive_count=[128, 128])
            vn_ready = T.alloc_barrier(arrive_count=[128, 128]) if delta else None     # V_new's two slots
            vn_free = T.alloc_barrier(arrive_count=[128, 128]) if delta else None
            tx = T.get_thread_binding()
            # one code branch per warpgroup: the barriers tilelang inserts in a branch are its own
            if tx < 128:
                state_chain(K_s, V_s, W_s, G_s, S_s, Vn_s, Vw_s, S_f, WS, g_last, data_ready, data_free, s_ready,
                            s_free, vn_ready, vn_free, h0, ht, bb, bh, dv0)
            if tx >= 128 and tx < 256:
                output_chunks(0, Q_s, K_s, V_s, G_s, S_s, Vn_s, O_s, acc_o, A, A_cast, data_ready, data_free,
                              s_ready, s_free, vn_ready, vn_free, scale, O, bb, bh, dv0)
            if out_groups > 1:
                if tx >= 256 and tx < 384:
                    output_chunks(1, Q_s, K_s, V_s, G_s, S_s, Vn_s, O_s, acc_o_1, A_1, A_cast_1, data_ready,
                                  data_free, s_ready, s_free, vn_ready, vn_free, scale, O, bb, bh, dv0)
            if tx >= 128 * (1 + out_groups) and tx < 128 * (1 + out_groups) + 32:
                load_chunks(Q, K, V, W, G, Q_s, K_s, V_s, W_s, G_s, data_ready, data_free, bb, bh, dv0)

    return main


# Warpgroups run their branches at once: no two shared buffers may share bytes (build.WARP_SPECIALISED).
seq_in_loop_scalar.pass_configs = WARP_SPECIALISED
# --8<-- [end:seq_in_loop_scalar]


# --8<-- [start:state_output_pass]
def state_output_pass(DK, DV, chunk_size=64, block_dv=32, slots=3, out_groups=2, dtype="bfloat16",
                      initial_state=False, final_state=False):
    """``state_pass`` and ``chunk_output`` fused: the output of a chunk is made from the state it
    enters with, so neither the snapshots nor ``U - W S`` go through HBM. It is level 3's
    warp-specialised pass (``seq_in_loop_scalar`` above) with no gate and the delta rule's
    chain: warpgroup 0 writes ``S`` and ``V_new = U - W S`` to shared memory and updates ``S <- S + K^T
    V_new``; ``out_groups`` output warpgroups form ``tril(Q K^T)`` before the chunk's state is needed,
    then ``scale (Q S + tril(Q K^T) V_new)``; one producer warp loads q, k, U's value columns and ``W``.
    Arguments at run time: ``Q, K [B, T, H, DK]``, ``U [B, T, H, DV]``, ``W [B, T, H, DK]``, a ``[1]``
    stand-in for the gate, ``scale``, ``h0 [B, H, DK, DV]`` (float32), then the outputs ``O [B, T, H,
    DV]`` (dtype) and ``ht`` (float32); the state flags as in ``kda.kernels.chapters.linear_attention.seq_in_loop``."""
    return seq_in_loop_scalar(DK, DV, chunk_size, block_dv, slots, out_groups, dtype, gate="none", delta=True,
                              initial_state=initial_state, final_state=final_state)


state_output_pass.pass_configs = WARP_SPECIALISED
# --8<-- [end:state_output_pass]


# --8<-- [start:pass_launch]
def gate_cumsum(g, flags):
    """``chunk_cumsum`` of a gate per head ``g [B, T, H]``: ``G [B, H, T_pad]`` in float32 (log2 units, chunk
    by chunk, as ``seq_in_loop_scalar`` reads it); a gate out of range sets ``flags[0]`` as it is read."""
    from kda.kernels.build import compile_program

    B, T, H = g.shape
    C = launch.KERNEL_CONFIG["chunk_size"]
    with torch.cuda.device(g.device):
        cumsum = compile_program(chunk_cumsum, (), D=1, chunk_size=C, gate_dtype=str(g.dtype).removeprefix("torch."))
        G = torch.empty(B, H, ceildiv(T, C) * C, dtype=torch.float32, device=g.device)
        cumsum(g.contiguous().view(B, T, H, 1), G.view(*G.shape, 1), flags)
    return G


def pass_launch(q, k, v, scale, h0, output_final_state, gate="none", G=None, W=None):
    """``seq_in_loop_scalar`` on ``q, k [B, T, H, DK]`` and ``v [B, T, H, DV]`` up to its launch, as ``(launch,
    o, final state or None)``: ``G`` as ``gate`` reads it (``"per_token"``: ``gate_cumsum``'s; ``"constant"``:
    ``log2 a [H]``; ``"none"``: no ``G``). With the delta rule's ``W`` (``v`` then holds ``U``), its
    ``state_output_pass`` instead."""
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV = v.shape[-1]
    device = q.device
    sizes = dict(DK=DK, DV=DV, chunk_size=launch.KERNEL_CONFIG["chunk_size"], dtype=launch.dtype_name(q.dtype),
                 initial_state=h0 is not None, final_state=output_final_state)
    with torch.cuda.device(device):
        if W is None:
            kernel = compile_program(seq_in_loop_scalar, (), gate=gate, block_dv=launch.KERNEL_CONFIG["block_dv"],
                                     **launch.SCALAR_PASS_CONFIG, **sizes)
            W = launch.stand_in(4, q.dtype, device)
        else:
            kernel = compile_program(state_output_pass, (), **sizes)
    G = G if G is not None else launch.stand_in(1, torch.float32, device)
    return launch.pass_held(kernel, (q.contiguous(), k.contiguous(), v.contiguous(), W, G, scale), h0,
                            output_final_state, (B, H, DK, DV), (B, T, H, DV), q.dtype, device)
# --8<-- [end:pass_launch]
