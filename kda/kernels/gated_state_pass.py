"""The sequential state pass of the gated delta rule, the output fused (``kda.chunk_kda`` and
``kda.chunk_gated_delta_rule`` after ``kernels.chunk_intra.chunk_intra``).

Per chunk, with ``decay`` the chunk's state decay per key channel: ``V_new = U - W S``,
``O = Qw S + A_qk V_new``, ``S <- diag(decay) S + Kw^T V_new``. Mirrors ``kda.reference.level5``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch
from tilelang.layout import make_swizzled_layout

from kda import launch, packed
from kda.chunking import CHUNK_SIZE
from kda.kernels.build import WARP_SPECIALISED
from kda.kernels.chunk_intra import ChunkForm
from kda.kernels.stages import ACCUM, load_state, state_shape, store_state


# --8<-- [start:gated_state_output_pass]
def gated_state_output_pass(DK, DV, chunk_size=64, block_dv=32, dtype="bfloat16", varlen=False, initial_state=False,
                            final_state=False, whole_stores=False, chain_first=0, swizzled_u=False):
    """Arguments at run time: ``Qw, Kw, W [B, T, H, DK]``, ``U [B, T, H, DV]``, ``A_qk [B, T, H, C]``
    (dtype, scale included), ``decay [B, H, NC, DK]`` and ``h0 [B, H, DK, DV]`` (float32), then the
    outputs ``O [B, T, H, DV]`` (dtype) and ``ht`` (float32), and last the tables of packed
    sequences ``cu_seqlens [N + 1]``, ``chunk_offsets [N + 1]`` and ``seq_groups [NG + 1]`` (int32,
    ``chunk_table``; dense, ``[1]`` stand-ins). With ``varlen`` (packed sequences, ``B = 1``) ``h0``
    and ``ht`` are ``[N, H, DK, DV]``, ``decay`` is in the order of the chunk table, and the rows of a
    sequence's last chunk past its end are masked. Without ``initial_state`` the state starts at
    zero and ``h0`` is a stand-in of shape ``[1, 1, 1, 1]`` that is never read; without
    ``final_state`` no state is written and ``ht`` is such a stand-in.

    Warp-specialised by hand. Warpgroup 0 carries the state's chain (S to shared memory, W S,
    V_new = U - W S, S <- diag(decay) S + Kw^T V_new), warpgroup 1 the output beside it
    (Qw S, then + A_qk V_new), one producer warp loads two chunk slots by TMA. The chain waits
    for two GEMMs per chunk instead of four (run 39 in results/tuning).

    A block carries one sequence (dense) or a group of packed sequences one after another
    (``seq_groups``: those whose first chunk lies in one window of ``GROUP_CHUNKS`` chunks), the
    state starting again at each: a thousand short sequences take a few hundred blocks, not one
    block per sequence, each paying its start and its pipeline's fill.

    ``whole_stores`` (packed sequences): ``V_new``, its rows past a sequence's end zeroed, made in ``W S``'s registers
    and stored whole. Stored element by element under that mask, the loop has a barrier of the warpgroup in every step
    from tilelang 0.1.15 (16 a chunk, on the chain; the dense loop has none). On since runs 141 and 143.

    ``chain_first``: the output warpgroup's GEMMs wait for the chain's on the tensor cores they share: 1, ``Qw S``
    until the chain's ``W S`` is done (both start when ``S`` is published); 2, ``A_qk V_new`` also until the chain's
    ``Kw^T V_new`` is. The same products in the same order, so the same bits; 0 (the default) lets them run at once.

    ``swizzled_u``: ``U``'s slots swizzled as the GEMM operands are. The chain reads them element by element only, and
    tilelang keeps such a tile row by row: the compiled source reads a warp's eight rows of 64 bytes on four-way
    conflicting banks, on the chain (GDN's pass waited on the same, run 147). The same bits."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.dynamic("NC") if varlen else T.ceildiv(S, C)
    N, NG = T.dynamic("N"), T.dynamic("NG")
    states = N if varlen else B
    h0_shape, ht_shape = state_shape(initial_state, states, H, DK, DV), state_shape(final_state, states, H, DK, DV)

    @T.macro
    def body(Qw, Kw, W, U, A_qk, decay, h0, O, ht, bv, bh, bb, n_first, n_count, seq):
        """Value columns ``bv`` of head ``bh``, sequences ``n_first .. n_first + n_count - 1`` of batch
        row ``bb``; ``seq(n)`` gives sequence ``n``'s first token, end, first chunk in ``decay`` and
        chunk count. ``j`` counts the block's chunks over all its sequences: slots and barrier
        phases follow it."""
        dv0 = bv * BV
        Qw_s = T.alloc_shared([2, C, DK], dtype)         # two slots: the block's chunk j in slot j % 2
        Kw_s = T.alloc_shared([2, C, DK], dtype)
        W_s = T.alloc_shared([2, C, DK], dtype)
        A_s = T.alloc_shared([2, C, C], dtype)
        U_s = T.alloc_shared([2, C, BV], dtype)
        if swizzled_u:
            T.annotate_layout({U_s: make_swizzled_layout(U_s)})
        decay_s = T.alloc_shared([2, DK], ACCUM)
        S_s = T.alloc_shared([DK, BV], dtype)
        Vn_s = T.alloc_shared([C, BV], dtype)
        O_s = T.alloc_shared([C, BV], dtype)
        S_f = T.alloc_fragment([DK, BV], ACCUM)
        WS = T.alloc_fragment([C, BV], ACCUM)
        acc_o = T.alloc_fragment([C, BV], ACCUM)
        data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
        data_free = T.alloc_barrier(arrive_count=[256, 256])     # both warpgroups
        s_ready = T.alloc_barrier(arrive_count=128)
        s_free = T.alloc_barrier(arrive_count=128)
        vn_ready = T.alloc_barrier(arrive_count=128)
        vn_free = T.alloc_barrier(arrive_count=128)
        if chain_first >= 1:
            ws_done = T.alloc_barrier(arrive_count=128)          # chain -> output
        if chain_first >= 2:
            update_done = T.alloc_barrier(arrive_count=128)      # chain -> output
        tx = T.get_thread_binding()
        j0 = lambda n: seq(n)[2] - seq(n_first)[2]      # the block's count of chunks before sequence n
        # a wait for parity (j + 1) % 2 passes at j = 0 (the phase before the first) and then
        # waits for the other side's arrival of chunk j - 1
        if tx < 128:
            for s in T.serial(n_count):
                n = n_first + s
                t_first, t_end, c_first, n_chunks = seq(n)
                load_state(h0, S_f, n, bh, dv0, initial_state)
                for c in T.serial(n_chunks):
                    j = j0(n) + c
                    slot = j % 2
                    T.barrier_wait(data_ready[slot], (j // 2) % 2)
                    T.barrier_wait(s_free, (j + 1) % 2)               # warpgroup 1 has read S_s
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    T.gemm(W_s[slot, :, :], S_s, WS, clear_accum=True)
                    if chain_first >= 1:
                        T.barrier_arrive(ws_done)
                    T.barrier_wait(vn_free, (j + 1) % 2)
                    if varlen and whole_stores:     # rows past the sequence are the next one's
                        for i, jj in T.Parallel(C, BV):
                            WS[i, jj] = T.if_then_else(t_first + c * C + i < t_end, U_s[slot, i, jj] - WS[i, jj], 0.0)
                        T.copy(WS, Vn_s)
                    else:
                        for i, jj in T.Parallel(C, BV):
                            if varlen:
                                Vn_s[i, jj] = T.if_then_else(t_first + c * C + i < t_end, U_s[slot, i, jj] - WS[i, jj],
                                                             0.0)
                            else:
                                Vn_s[i, jj] = U_s[slot, i, jj] - WS[i, jj]
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    for i, jj in T.Parallel(DK, BV):
                        S_f[i, jj] = S_f[i, jj] * decay_s[slot, i]
                    T.gemm(Kw_s[slot, :, :], Vn_s, S_f, transpose_A=True)
                    if chain_first >= 2:        # one phase ahead at most: the chain waited for vn_free of chunk j - 1
                        T.barrier_arrive(update_done)
                    T.barrier_arrive(data_free[slot])
                store_state(S_f, ht, n, bh, dv0, final_state)
        elif tx < 256:
            for s in T.serial(n_count):
                n = n_first + s
                t_first, t_end, c_first, n_chunks = seq(n)
                for c in T.serial(n_chunks):
                    j = j0(n) + c
                    slot = j % 2
                    T.barrier_wait(data_ready[slot], (j // 2) % 2)
                    T.barrier_wait(s_ready, j % 2)
                    if chain_first >= 1:
                        T.barrier_wait(ws_done, j % 2)
                    T.gemm(Qw_s[slot, :, :], S_s, acc_o, clear_accum=True)
                    T.barrier_arrive(s_free)
                    T.barrier_wait(vn_ready, j % 2)
                    if chain_first >= 2:
                        T.barrier_wait(update_done, j % 2)
                    T.gemm(A_s[slot, :, :], Vn_s, acc_o)
                    T.barrier_arrive(vn_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(acc_o, O_s)
                    if varlen:
                        for i, jj in T.Parallel(C, BV):
                            if t_first + c * C + i < t_end:
                                O[bb, t_first + c * C + i, bh, dv0 + jj] = O_s[i, jj]
                    else:
                        T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])
        elif tx < 288:
            for s in T.serial(n_count):
                n = n_first + s
                t_first, t_end, c_first, n_chunks = seq(n)
                for c in T.serial(n_chunks):
                    j = j0(n) + c
                    slot = j % 2
                    T.barrier_wait(data_free[slot], (j // 2 + 1) % 2)
                    rows = slice(t_first + c * C, t_first + (c + 1) * C)
                    T.tma_copy(Qw[bb, rows, bh, :], Qw_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(Kw[bb, rows, bh, :], Kw_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(W[bb, rows, bh, :], W_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(A_qk[bb, rows, bh, :], A_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(U[bb, rows, bh, dv0:dv0 + BV], U_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(decay[bb, bh, c_first + c, :], decay_s[slot, :], barrier=data_ready[slot])
                    T.barrier_arrive(data_ready[slot])

    # dense and packed share one signature: dense, the three tables are [1] stand-ins, never read
    BB = 1 if varlen else B
    table = lambda rows: [rows] if varlen else [1]

    @T.prim_func
    def main(
        Qw: T.Tensor([BB, S, H, DK], dtype),
        Kw: T.Tensor([BB, S, H, DK], dtype),
        W: T.Tensor([BB, S, H, DK], dtype),
        U: T.Tensor([BB, S, H, DV], dtype),
        A_qk: T.Tensor([BB, S, H, C], dtype),
        decay: T.Tensor([BB, H, NC, DK], ACCUM),
        h0: T.Tensor(h0_shape, ACCUM),
        O: T.Tensor([BB, S, H, DV], dtype),
        ht: T.Tensor(ht_shape, ACCUM),
        cu_seqlens: T.Tensor(table(N + 1), "int32"),
        chunk_offsets: T.Tensor(table(N + 1), "int32"),
        seq_groups: T.Tensor(table(NG + 1), "int32"),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, NG if varlen else B, threads=384) as (bv, bh, lane):
            if varlen:                  # lane: a group of packed sequences
                body(Qw, Kw, W, U, A_qk, decay, h0, O, ht, bv, bh, 0, seq_groups[lane],
                     seq_groups[lane + 1] - seq_groups[lane],
                     lambda n: (cu_seqlens[n], cu_seqlens[n + 1], chunk_offsets[n],
                                chunk_offsets[n + 1] - chunk_offsets[n]))
            else:                       # lane: a batch row, one sequence
                body(Qw, Kw, W, U, A_qk, decay, h0, O, ht, bv, bh, lane, lane, 1, lambda n: (0, S, 0, NC))

    return main


# Warpgroups run their branches at once: no two shared buffers may share bytes (build.WARP_SPECIALISED).
gated_state_output_pass.pass_configs = WARP_SPECIALISED
# --8<-- [end:gated_state_output_pass]


# --8<-- [start:single_chunk_gated_output]
def single_chunk_gated_output(DK, DV, chunk_size=64, block_dv=64, dtype="bfloat16", initial_state=False,
                              final_state=False, threads=128):
    """``gated_state_output_pass`` for packed sequences of at most one chunk each, with its arguments (``varlen``; its
    ``seq_groups`` not read): one block per (value block, head, sequence) and no chain. The pass carries a group of
    sequences one after another through its warpgroups, one block per SM, so each short sequence costs it a chunk's
    latency; here each is a small block of its own, several per SM: ``V_new = U - W S0`` (its rows past the sequence
    zero), ``O = Qw S0 + A_qk V_new`` and ``S = diag(decay) S0 + Kw^T V_new``, in the pass's dtypes (``S0`` and
    ``V_new`` rounded to ``dtype`` as operands). Without ``initial_state`` ``O = A_qk U`` (the causal ``A_qk`` keeps
    the rows past the end out of the stored rows) and ``W``, ``Qw`` are not read. An empty sequence's final state is
    its initial one."""
    S, H = T.dynamic("T"), T.dynamic("H")
    NC, N, NG = T.dynamic("NC"), T.dynamic("N"), T.dynamic("NG")
    C, BV = chunk_size, block_dv

    @T.prim_func
    def main(
        Qw: T.Tensor([1, S, H, DK], dtype),
        Kw: T.Tensor([1, S, H, DK], dtype),
        W: T.Tensor([1, S, H, DK], dtype),
        U: T.Tensor([1, S, H, DV], dtype),
        A_qk: T.Tensor([1, S, H, C], dtype),
        decay: T.Tensor([1, H, NC, DK], ACCUM),
        h0: T.Tensor(state_shape(initial_state, N, H, DK, DV), ACCUM),
        O: T.Tensor([1, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, N, H, DK, DV), ACCUM),
        cu_seqlens: T.Tensor([N + 1], "int32"),
        chunk_offsets: T.Tensor([N + 1], "int32"),
        seq_groups: T.Tensor([NG + 1], "int32"),
    ):
        # the sequences on the grid's first axis: a batch may hold more than the 65,535 blocks of its third
        with T.Kernel(N, T.ceildiv(DV, BV), H, threads=threads) as (n, bv, bh):
            dv0 = bv * BV
            t0 = cu_seqlens[n]
            L = cu_seqlens[n + 1] - t0
            A_s = T.alloc_shared([C, C], dtype)
            U_s = T.alloc_shared([C, BV], dtype)
            O_s = T.alloc_shared([C, BV], dtype)
            acc_o = T.alloc_fragment([C, BV], ACCUM)
            if final_state:
                S_f = T.alloc_fragment([DK, BV], ACCUM)
                load_state(h0, S_f, n, bh, dv0, initial_state)
            if initial_state:
                S_s = T.alloc_shared([DK, BV], dtype)
                T.copy(h0[n, bh, :, dv0:dv0 + BV], S_s)
            if L > 0:
                rows = slice(t0, t0 + C)                     # past the sequence: the next one's rows, or zeros
                T.copy(A_qk[0, rows, bh, :], A_s)
                T.copy(U[0, rows, bh, dv0:dv0 + BV], U_s)
                if initial_state or final_state:
                    Vn_s = T.alloc_shared([C, BV], dtype)
                    VN = T.alloc_fragment([C, BV], ACCUM)
                    if initial_state:
                        W_s = T.alloc_shared([C, DK], dtype)
                        T.copy(W[0, rows, bh, :], W_s)
                        T.gemm(W_s, S_s, VN, clear_accum=True)
                        for i, j in T.Parallel(C, BV):
                            VN[i, j] = T.if_then_else(i < L, U_s[i, j] - VN[i, j], 0.0)
                    else:
                        for i, j in T.Parallel(C, BV):
                            VN[i, j] = T.if_then_else(i < L, U_s[i, j], 0.0)
                    T.copy(VN, Vn_s)
                if initial_state:
                    Qw_s = T.alloc_shared([C, DK], dtype)
                    T.copy(Qw[0, rows, bh, :], Qw_s)
                    T.gemm(Qw_s, S_s, acc_o, clear_accum=True)
                    T.gemm(A_s, Vn_s, acc_o)
                else:
                    T.gemm(A_s, U_s, acc_o, clear_accum=True)
                if final_state:
                    Kw_s = T.alloc_shared([C, DK], dtype)
                    decay_s = T.alloc_shared([DK], ACCUM)
                    T.copy(Kw[0, rows, bh, :], Kw_s)
                    T.copy(decay[0, bh, chunk_offsets[n], :], decay_s)
                    for i, j in T.Parallel(DK, BV):
                        S_f[i, j] = S_f[i, j] * decay_s[i]
                    T.gemm(Kw_s, Vn_s, S_f, transpose_A=True)
                T.copy(acc_o, O_s)
                for i, j in T.Parallel(C, BV):
                    if i < L:
                        O[0, t0 + i, bh, dv0 + j] = O_s[i, j]
            if final_state:
                store_state(S_f, ht, n, bh, dv0, final_state)

    return main
# --8<-- [end:single_chunk_gated_output]

# --8<-- [start:state_pass_launch]
def state_pass_columns(B: int, H: int, DV: int, sm_count: int) -> int:
    """Value columns per block of the state pass: 64 while that still gives every SM a block,
    else 32 (``B``: the blocks' sequences or groups of packed sequences, ``seq_groups``). On the
    H200 64 columns took the pass from 0.54 to 0.42 ms at (1, 8192, 96) and from 0.64 to 0.48 ms
    at (4, 4096, 64), but at (1, 32768, 32) its 64 blocks left half the SMs idle (0.78 against
    0.61 ms; run 39 in results/tuning)."""
    return 64 if B * H * (DV // 64) >= sm_count else 32


def run_state_pass(form: ChunkForm, h0, table=None, output_final_state=True):
    """Stage 3, sequential over chunks from ``h0 [B, H, DK, DV]`` (``None``: zeros, which the kernel
    starts from without reading any); returns ``o`` and the float32 final state (``None`` without
    ``output_final_state``: none is written). With the ``table`` of packed sequences, one state per
    sequence: ``h0`` and the final state are ``[N, H, DK, DV]``."""
    return launch.launched(state_pass_launch(form, h0, table, output_final_state))


# gated_state_output_pass with whole_stores for packed sequences (no barrier in any step of its V_new loop). On since
# its GPU test (same bits as the masked stores, dense and packed) passed on the H200 (run 141) and run 143 (H100) timed
# KDA's packed op: 96 random lengths 2.066 ms against 2.078, 1024 sequences of 1 to 64 tokens 3.628 against 3.675, the
# outputs equal bit for bit (fla's chunk_kda: 4.338 and 5.393).
WHOLE_STORES = True


# gated_state_output_pass with chain_first (1: the output's Qw S waits for the chain's W S; 2: its A_qk V_new also for
# the chain's Kw^T V_new), so that the GEMMs on the chain do not share the tensor cores with the output's. The same
# bits by construction: run 147 (H100) confirmed it for 1 and 2, dense and packed. Off: not timed through KDA's op yet
# (run 145's script); GDN's pass gained nothing from it (run 147).
CHAIN_FIRST = 0


# Packed sequences that all fit one chunk (known on the host: a table from chunk_table) by single_chunk_gated_output,
# one small block per (sequence, head, packed.SINGLE_CHUNK_COLUMNS value columns), instead of the pass. Its GPU tests
# passed (run 147, H100); off until it is timed (run 144's script ran out of memory in that call).
SINGLE_CHUNK_OUTPUT = False


# gated_state_output_pass with swizzled_u (U's slots swizzled: the chain's element-by-element reads of them without
# bank conflicts). The same bits (run 149's GPU tests, H100), and not measurably faster: chunk_kda at
# (1, 32768, 32, 128) 2.111 ms against 2.121, the pass 0.656 against 0.658 (run 149). Off.
SWIZZLED_U = False


def takes_single_chunk_output(table, DV: int) -> bool:
    """Whether the packed sequences of ``table`` go through ``single_chunk_gated_output`` (``SINGLE_CHUNK_OUTPUT``):
    ``packed.fits_one_chunk``."""
    return SINGLE_CHUNK_OUTPUT and packed.fits_one_chunk(table, DV)


def state_pass_launch(form: ChunkForm, h0, table=None, output_final_state=True):
    """``run_state_pass`` up to its launch: the compiled pass with its arguments and outputs ready,
    as ``(launch, o, final state or None)``; nothing runs until ``launch()``. Packed sequences of at most one chunk
    each by ``single_chunk_gated_output`` where ``takes_single_chunk_output`` says so, with the same arguments."""
    from kda.kernels.build import compile_program, sm_count

    B, T, H, DK = form.Qw.shape
    DV = form.U.shape[-1]
    device = form.Qw.device
    N, lanes, tables = packed.sequence_tables(table, B, device)
    params = dict(DK=DK, DV=DV, chunk_size=CHUNK_SIZE, dtype=launch.dtype_name(form.Qw.dtype),
                 initial_state=h0 is not None, final_state=output_final_state)
    with torch.cuda.device(device):
        if takes_single_chunk_output(table, DV):
            state_pass = compile_program(single_chunk_gated_output, (), block_dv=packed.SINGLE_CHUNK_COLUMNS,
                                         **params)
        else:
            state_pass = compile_program(gated_state_output_pass, (), varlen=table is not None,
                                         block_dv=state_pass_columns(lanes, H, DV, sm_count(device)), **params,
                                         **({"whole_stores": True} if WHOLE_STORES and table is not None else {}),
                                         **({"chain_first": CHAIN_FIRST} if CHAIN_FIRST else {}),
                                         **({"swizzled_u": True} if SWIZZLED_U else {}))
    return launch.pass_held(state_pass, tuple(form), h0, output_final_state, (N, H, DK, DV), (B, T, H, DV),
                            form.U.dtype, device, tables)
# --8<-- [end:state_pass_launch]
