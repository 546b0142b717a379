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
it by forming ``K S`` and ``Q K^T`` once per value block inside the pass, which pays only with wide value
blocks (many heads or sequences: runs 53-56 in results/tuning). Run 89 found the pass fast there (0.51 ms
at (1, 8192, 96, 128)) and the first kernel slow (0.74 ms); run 90's arrangement of it takes 0.35 ms, and
the path is GDN's where its blocks fill the SMs (``kda.gated_delta.SCALAR_GATE_PATH``, 0.871 ms against
1.215 for level 5's path there). Mirrors ``kda.reference.scalar_gate.scalar_gate_chunked``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
from tilelang.layout import make_swizzled_layout
import torch

from kda import launch, packed
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.kernels.build import WARP_SPECIALISED
from kda.kernels.chunk_intra import KEY_BOUND
from kda.kernels.merge_by_halves import merge_by_halves
from kda.kernels.norms import NORM_SLICE, row_square_sums
from kda.kernels.stages import (ACCUM, FLOAT32_MAX, LOG2_E, decay_factor, invert_diagonal_blocks_by_columns,
                                load_beta_checked, load_state, log2_cumsum_by_columns, merge_by_substitution, real,
                                row_token, state_shape, store_state)


def doubling_steps(loaded, scratch, out, C):
    """The ``log2(C)`` steps of a doubling scan from ``loaded`` to ``out``, between ``scratch`` and ``out``
    after the first: (source, destination, distance). ``loaded`` is only read (the producer refills it)."""
    steps = C.bit_length() - 1
    assert C == 1 << steps and steps % 2 == 0, "an even number of steps ends in out"
    chain = [loaded] + [scratch if s % 2 == 0 else out for s in range(steps)]
    return [(chain[s], chain[s + 1], 1 << s) for s in range(steps)]


@T.macro
def log2_cumsum_by_scan(g, g_s, H_s, G_s, flags, bb, bh, t0, L, C, rows_s=None):
    """``G_s = cumsum(g) / ln 2`` over the chunk's ``C`` rows of ``g [B, T, H]`` from ``t0`` (0 past the real
    length ``L``) by a doubling scan (``log2(C)`` steps, each row adding the row ``d`` above it; ``g_s`` the
    loaded rows, ``H_s`` scratch) instead of one thread's running sum: 6 steps on the chain, not 64. The
    sums group otherwise, so ``G`` differs from ``log2_cumsum_by_columns``' in the last bits. A gate that is
    not finite and ``<= 0`` sets ``flags[0]``, as there. ``g_s`` is filled by the producer warps of the
    warp-specialised loop, which refill it as soon as ``K K^T`` is issued: the scan only reads it. Not
    ``T.cumsum``: in a warp-specialised kernel its warp scan (tilelang 0.1.15, ``tl::CumSum2D``) numbers
    warps from thread 0, so the consumers, threads 128 to 255, all skip it and ``G`` stays 0 (run 111). The rows
    past ``L`` are set to row ``L - 1`` at the end: summed in another grouping, they differed from it in the last bit
    (run 112). ``rows_s``: the token of each row, where the rows are gathered (``row_token``)."""
    for i in T.Parallel(C):
        x = T.Cast(ACCUM, g[bb, row_token(t0, i, L, rows_s), bh])
        g_s[i, 0] = T.if_then_else(i < L, x * LOG2_E, 0.0)
        if i < L:
            if real(x <= 0.0) * real(x >= -FLOAT32_MAX) == 0.0:        # NaN fails both
                flags[0] = 1
    for src, dst, d in doubling_steps(g_s, H_s, G_s, C):
        for i in T.Parallel(C):
            dst[i, 0] = src[i, 0] + T.if_then_else(i >= d, src[T.max(i - d, 0), 0], 0.0)
    for i in T.Parallel(C):             # flat past the end to the bit: the rows there summed the zeros in another order
        if i >= L:
            G_s[i, 0] = G_s[L - 1, 0]


# --8<-- [start:chunk_gated_inverse]
def chunk_gated_inverse(DK, chunk_size=64, block=16, dtype="bfloat16", gate_dtype="float32", value_groups=1,
                        varlen=False, threads=128, chunks_per_block=4, num_stages=1, min_blocks=3,
                        merge="substitution", heads_first=False, check_keys=False, cumsum="serial", compact=False,
                        gate_free=False, beta_dtype="float32", trace=False):
    """Arguments at run time: ``K [B, T, HQ, DK]``, ``g [B, T, H]`` (``gate_dtype``, natural log),
    ``beta [B, T, H]`` (``beta_dtype``: the caller's, read as it is, no float32 copy), then the outputs ``G [B, H,
    NC C]`` (float32: chunk ``c``'s cumsum in log2 units at ``c C ..``, flat past the end; dense, ``[B P, H, NC C /
    P]`` cuts each sequence into ``P`` runs of whole chunks, run ``p`` of sequence ``b`` in row ``b P + p``), ``Tb
    [B, T, H, C]`` (dtype; zero above the diagonal and in the columns past the end) and ``flags [2]`` (int32,
    zeroed by the caller: ``flags[0]`` a gate not finite and ``<= 0``, ``flags[1]`` a ``b`` outside ``[0, 1]``), and
    last the chunk table ``chunks [NC,
    2]`` of packed sequences (``varlen``, ``B = 1``: each chunk's first token and length; dense, a ``[1,
    1]`` stand-in). ``H = value_groups HQ``: value head ``h`` reads key head ``h // value_groups``. The
    solve is level 4's (``chunk_wy``): the diagonal blocks by columns, then block substitution;
    ``chunks_per_block`` chunks of one head per block, the next one's loads in flight when
    ``num_stages > 1``; ``min_blocks`` blocks per SM (registers capped to fit them); ``merge="products"``
    merges the blocks by four tf32 GEMMs instead (``kda.kernels.wy_solve.merge_by_products``). The
    defaults are run 90's fastest (H200, bit for bit the same ``G`` and ``Tb`` as every arrangement
    that merges by substitution): 0.350 ms at (1, 8192, 96, 128) against 0.745 for 8 chunks, two stages and one block
    per SM (159 registers); three blocks per SM need 78 registers and one stage to fit in shared memory.
    ``heads_first``: the heads along the grid's first axis, so that blocks launched together read the same
    tokens of neighbouring heads (FlashQLA's ``kkt_solve`` order; not yet timed here). ``check_keys`` (raw keys;
    ``kda.gated_delta``'s ``KEY_CHECK_IN_KERNEL``): ``flags [3]``, ``flags[2] = 1`` where a row's ``b ||k||^2``
    (``||k||^2`` the diagonal of its ``K K^T``, already made) exceeds ``kda.kernels.chunk_intra.KEY_BOUND``.
    ``compact`` (``merge="halves"``): the merge's scratch in ``A_s``'s spent quadrants and ``Tb``'s tile over ``A_s``
    once the merge is done, 22 KB of shared memory less (72.7 KB to 50.9 KB: four blocks per SM instead of three).
    ``gate_free``: ``Tb = (I + strict(diag(b) K K^T))^-1 diag(b)``, the inverse without the gate, which the pass then
    gates (``inverse_state_output_pass(gates_inverse=True)``): with one gate per head the gated inverse is ``Tb_ij
    2^(G_i - G_j)`` exactly (a similarity by ``diag(2^G)``), so this kernel takes no exponential of a pair (FlashQLA's
    ``kkt_solve`` and fused forward split it so). ``G`` is written either way. ``trace`` (dense; for tuning): instead
    of ``G``, the SM's clock less the block's start in each chunk's ``C`` entries of ``G`` at the points of
    ``INVERSE_TRACE_EVENTS``, stamped by the kernel's thread 0 (tilelang moves the loop's work to a consumer
    warpgroup and renumbers it there; ``results/tuning/run154-inverse-trace.py`` reads them)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    HQ = T.dynamic("HQ")
    C = chunk_size
    NC = T.dynamic("NC") if varlen else T.ceildiv(S, C)
    BB = 1 if varlen else B
    # G's rows: one per sequence, or (dense) one per run of whole chunks where the caller cuts each sequence into
    # GB / B runs of GL / C chunks (the split's layout, kda.distributed; no copy of G there)
    GB, GL = (1, NC * C) if varlen else (T.dynamic("GB"), T.dynamic("GL"))
    assert merge in ("substitution", "products", "halves") and (merge == "substitution" or C == 4 * block)
    assert not compact or merge == "halves", "compact: the merge by halves only"
    assert cumsum in ("serial", "scan")
    if merge == "products":
        from kda.kernels.wy_solve import merge_by_products

    @T.prim_func
    def main(
        K: T.Tensor([BB, S, HQ, DK], dtype),
        g: T.Tensor([BB, S, H], gate_dtype),
        beta: T.Tensor([BB, S, H], beta_dtype),
        G: T.Tensor([GB, H, GL], ACCUM),
        Tb: T.Tensor([BB, S, H, C], dtype),
        flags: T.Tensor([3 if check_keys else 2], "int32"),
        chunks: T.Tensor([NC, 2] if varlen else [1, 1], "int32"),
    ):
        grid = (H, T.ceildiv(NC, chunks_per_block)) if heads_first else (T.ceildiv(NC, chunks_per_block), H)
        with T.Kernel(*grid, BB, threads=threads) as (first, second, bb):
            cb, bh = (second, first) if heads_first else (first, second)
            K_s = T.alloc_shared([C, DK], dtype)
            g_s = T.alloc_shared([C, 1], ACCUM)
            beta_s = T.alloc_shared([C], ACCUM)
            # the loop hands its loaded buffers back to the producer once the last GEMM that reads one
            # of them (K K^T) is issued (tilelang 0.1.15), so what is read after it gets copies of its own
            G_s = T.alloc_shared([C, 1], ACCUM)
            H_s = T.alloc_shared([C, 1], ACCUM) if cumsum == "scan" else None     # the scan's scratch
            b_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            # compact: Tb's tile over A_s (float32 C x C, spent once the merge is done), its rows' first halves
            Tb_s = T.view(A_s, [C, 2 * C], dtype) if compact else T.alloc_shared([C, C], dtype)
            KK = T.alloc_fragment([C, C], ACCUM)
            x_col = T.alloc_local([block], ACCUM)
            hq = bh // value_groups if value_groups > 1 else bh
            if min_blocks > 1:                                # registers capped so that this many fit an SM
                T.annotate_min_blocks_per_sm(min_blocks)
            c0 = cb * chunks_per_block
            if trace:
                t_base = T.alloc_local([1], "int64")
                t_base[0] = T.call_extern("int64", "clock64")
            for ci in T.Pipelined(T.min(chunks_per_block, NC - c0), num_stages=num_stages):
                c = c0 + ci
                t0 = chunks[c, 0] if varlen else c * C
                L = chunks[c, 1] if varlen else T.min(C, S - t0)
                stamp = (lambda event: inverse_trace_stamp(G, t_base, bb, bh, c * C + event)) if trace else \
                    (lambda event: None)
                stamp(0)
                T.copy(K[bb, t0:t0 + C, hq, :], K_s)          # rows past L: the next sequence's, or zeros
                load_beta_checked(beta, beta_s, flags, t0, L, C, bb, bh)
                if cumsum == "scan":
                    log2_cumsum_by_scan(g, g_s, H_s, G_s, flags, bb, bh, t0, L, C)
                else:
                    for i in T.Parallel(C):
                        g_s[i, 0] = T.Cast(ACCUM, g[bb, t0 + T.min(i, L - 1), bh])
                    log2_cumsum_by_columns(g_s, G_s, L, C, 1, flags)
                for i in T.Parallel(C):
                    b_s[i] = beta_s[i]
                    if trace:                       # G holds the stamps
                        pass
                    elif varlen:
                        G[bb, bh, c * C + i] = G_s[i, 0]
                    else:                           # run c // (GL / C) of the sequence's GB / B
                        G[bb * (GB // B) + c // (GL // C), bh, c % (GL // C) * C + i] = G_s[i, 0]
                stamp(1)
                T.gemm(K_s, K_s, KK, transpose_B=True, clear_accum=True)
                stamp(2)
                if merge == "products":             # it reads the blocks above the diagonal
                    T.clear(Tinv_s)
                for i, j in T.Parallel(C, C):       # rows past the end: b = 0
                    if gate_free:                   # the pass gates the inverse
                        A_s[i, j] = KK[i, j] * b_s[i] * real(j < i)
                    else:
                        A_s[i, j] = KK[i, j] * b_s[i] * decay_factor(G_s[i, 0] - G_s[j, 0]) * real(j < i)
                    if check_keys:                  # the diagonal: b ||k||^2 against the delta rule's bound
                        if i == j and KK[i, j] * b_s[i] > KEY_BOUND:
                            flags[2] = 1
                stamp(3)
                invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, block)
                stamp(4)
                if merge == "products":             # four tf32 GEMMs (level 4's merge_by_products)
                    merge_by_products(A_s, Tinv_s, C, block)
                elif merge == "halves":
                    merge_by_halves(A_s, Tinv_s, C, block, in_place=compact)
                else:
                    merge_by_substitution(A_s, Tinv_s, C, block)
                stamp(5)
                for i, j in T.Parallel(C, C):       # the blocks above the diagonal were never written
                    Tb_s[i, j] = T.if_then_else(i // block >= j // block, Tinv_s[i, j] * b_s[j], 0.0)
                stamp(6)
                if varlen:                          # the tile's rows past L are the next sequence's
                    for i, j in T.Parallel(C, C):
                        if i < L:
                            Tb[bb, t0 + i, bh, j] = Tb_s[i, j]
                else:
                    T.copy(Tb_s[:, 0:C], Tb[bb, t0:t0 + C, bh, :])
                stamp(7)

    assert not (trace and varlen), "trace: dense batches"
    return main
# --8<-- [end:chunk_gated_inverse]


# The points of chunk_gated_inverse(trace=...)'s stamps, in the order of their entries in each chunk's slice of G.
INVERSE_TRACE_EVENTS = ("chunk start", "K, beta, G loaded", "K K^T done", "A made", "diagonal blocks inverted",
                        "blocks merged", "Tb made", "Tb stored")


@T.macro
def inverse_trace_stamp(G, t_base, bb, bh, entry):
    """``clock64()`` less the block's start into ``G[bb, bh, entry]`` by thread 0 (float32: exact below 2^24
    cycles)."""
    if T.get_thread_binding() == 0:
        G[bb, bh, entry] = T.Cast(ACCUM, T.call_extern("int64", "clock64") - t_base[0])


# The events of inverse_state_output_pass(trace=True), in the order of its trace's last axis: (warpgroup, the point
# of its chunk's work just passed).
TRACE_EVENTS = (("chain", "data ready"), ("chain", "S free"), ("chain", "S published"), ("chain", "V' ready"),
                ("chain", "K^T V' done"),
                ("values", "S ready"), ("values", "K S done"), ("values", "X stored"), ("values", "Tb X done"),
                ("values", "V' published"), ("values", "V_new published"),
                ("output", "data ready"), ("output", "Q K^T done"), ("output", "P stored"), ("output", "S ready"),
                ("output", "Q S done"), ("output", "V_new ready"), ("output", "P V_new done"), ("output", "O stored"),
                ("producer", "slot free"), ("producer", "loads issued"))


# The thread that stamps each warpgroup's events: its first (the producer's first lane).
TRACE_WRITERS = {"chain": 0, "values": 128, "output": 256, "producer": 384}


@T.macro
def trace_stamp(trace, t_base, blk, j, event):
    """``clock64()`` less the block's start into ``trace[blk, j, event]`` by the first thread of the event's warpgroup
    (float32: exact below 2^24 cycles)."""
    if T.get_thread_binding() == TRACE_WRITERS[event[0]]:
        trace[blk, j, TRACE_EVENTS.index(event)] = T.Cast(ACCUM, T.call_extern("int64", "clock64") - t_base[0])


def run_chunks(p, GL, S, C):
    """The chunks of run ``p`` of a sequence of ``S`` tokens cut into runs of ``GL`` (whole chunks, the last may be
    short)."""
    return T.min(GL // C, T.ceildiv(S - p * GL, C))


def run_span(p, GL, S, first_chunk, C, chunks):
    """Run ``p`` of ``chunks`` chunks (``run_chunks``) from its chunk ``first_chunk`` on, as
    ``inverse_state_output_pass``'s ``seq`` gives a sequence: its first token, its end, its first chunk in ``G``'s
    row and its count of chunks (none, or fewer than none, where the run is shorter). Plain functions: tilelang's
    kernel bodies bind the names they assign, and these would clash with the body's own."""
    return p * GL + first_chunk * C, T.min(p * GL + GL, S), first_chunk, chunks - first_chunk


# --8<-- [start:inverse_state_output_pass]
def inverse_state_output_pass(DK, DV, chunk_size=64, block_dv=128, dtype="bfloat16", value_groups=1, varlen=False,
                              initial_state=False, final_state=False, registers=(160, 128, 128, 40),
                              whole_stores=False, chain_first=0, trace=False, gates_inverse=False,
                              p_in_registers=False, v_in_registers=False, chain_scales_keys=False, runs=False):
    """Arguments at run time: ``Q, K [B, T, HQ, DK]``, ``V [B, T, H, DV]``, ``Tb [B, T, H, C]`` and
    ``G [B, H, NC C]`` of ``chunk_gated_inverse``, ``scale``, ``first_chunk`` (dense: each sequence from that chunk
    on, its rows before it neither read nor written; the split's warm-up windows over the runs as they lie, with no
    copies; 0 elsewhere; not read with ``varlen``), ``h0``, then ``O [B, T, H, DV]`` (dtype) and ``ht`` (the state
    flags as in ``kda.kernels.chapters.linear_attention.seq_in_loop``), and last the
    tables of packed sequences ``cu_seqlens [N + 1]``, ``chunk_offsets [N + 1]`` and ``seq_groups [NG + 1]`` (int32, as
    level 5's ``gated_state_output_pass`` takes them; dense, ``[1]`` stand-ins). With ``varlen`` ``h0``
    and ``ht`` are ``[N, H, DK, DV]``.

    One block per (value block, head, sequence or group of packed sequences), 512 threads,
    warp-specialised by hand:

    * warpgroup 0, the chain: ``S`` to shared memory (bf16) for the others, ``S <- 2^G_last S``, then
      ``+ K^T V'`` once warpgroup 1 has ``V'``;
    * warpgroup 1: ``X = V - 2^G (K S)`` (over ``V``'s slot), ``V_new = Tb X``, ``V' = 2^(G_last - G)
      V_new`` for the chain and ``V_new`` for the output;
    * warpgroup 2, the output: ``P = causal(scale Q K^T 2^(G_i - G_j))`` before the state is needed,
      then ``scale 2^G (Q S) + P V_new``;
    * one producer warp: ``q, k, v, Tb`` of the next chunk by TMA into the second of two slots, and
      ``2^G``, ``2^(G_last - G)`` once per row (the consumers read them instead of an ``exp2`` per
      element: run 54).

    Rows past the end of the data load as zeros and ``G`` is flat there. Rows past a packed
    sequence's end are the next sequence's: ``Tb``'s columns there are zero, their ``2^(G_last - G)``
    is set to 0 so that they leave the state alone, and their outputs are not stored.
    ``registers``: ``setmaxnreg`` of the four warpgroups (the chain holds ``S``: ``DK x block_dv``
    float32 over 128 threads). ``whole_stores``: warpgroup 1 makes ``X`` and ``V'`` in registers and stores each
    tile whole (``stmatrix``), ``X`` into ``V'``'s tile and ``V_new`` out before ``V'`` is made over it. Its two
    elementwise loops otherwise store into shared memory (``X`` over ``V``'s slot, ``V'`` element by element), and
    tilelang 0.1.15 gives each step of them a barrier of the warpgroup: 64 a chunk, on the chain. The same bits, and no
    faster (run 143; a first form, whose two tiles held at once, spilled and took the pass from 0.509 to 0.714 ms at
    (1, 8192, 96, 128) in run 140); on by default since run 149, beside ``p_in_registers`` (``WHOLE_STORES``).
    With it ``V``'s slots are swizzled: read element by element only, tilelang would keep them row by row.

    ``chain_first``: the output warpgroup's GEMMs wait for the chain's on the tensor cores they share: 1, ``Q S``
    until warpgroup 1's ``K S`` is done (both wait for the same ``S``, and only ``K S`` is on the chain); 2, ``P V_new``
    also until the chain's ``K^T V'`` is done. The same products in the same order, so the same bits; 0 (the default)
    lets them run at once.

    ``gates_inverse``: ``Tb`` is ``chunk_gated_inverse(gate_free=True)``'s, and warpgroup 1 gates it, ``Tb_ij 2^(G_i -
    G_j)`` into a tile of its own, while it waits for the chain's ``S`` (off the chain).

    ``p_in_registers``: the output warpgroup gates ``P`` in its registers and feeds it to ``P V_new`` from there (the
    A operand of a register-sourced wgmma) instead of storing it element by element into a shared tile: run 147's
    trace had that loop at about 3,400 cycles of a 7,500-cycle chunk (4,000 with ``whole_stores``, where it held
    back the chain's next ``S``).

    ``v_in_registers`` (with ``whole_stores``): warpgroup 1 reads ``V`` into registers (bf16) before it waits for
    ``S``, so that ``X = V - 2^G (K S)`` on the chain reads no shared memory (run 147: 1,760 cycles for that loop).

    ``chain_scales_keys`` (with ``whole_stores``): the chain adds ``(2^(G_last - G) K)^T V_new`` instead of ``K^T V'``,
    with the keys scaled into a tile of its own while it waits (it idles there), and reads ``V_new`` from the
    output's tile: warpgroup 1 makes and stores no ``V'`` (440 cycles of run 147's chain). The scale is rounded to bf16
    on the keys instead of on ``V_new``: not the same bits.

    ``runs`` (dense): each sequence cut into ``P`` runs of ``GL`` tokens (whole chunks; the last may be short),
    each run a sequence of its own as ``chunk_gated_inverse``'s ``G [B P, H, GL]`` has them (row ``b P + p``), with
    states ``[B P, H, DK, DV]`` and ``first_chunk`` counted in each run: the split of ``kda.distributed`` over the
    tokens as they lie, with no copy to pad the last run.

    ``trace`` (dense, without a final state; for tuning): ``ht`` is a float32 ``[B H NV, NC, len(TRACE_EVENTS)]``
    (``NV`` value blocks) into which the first thread of each warpgroup (the producer's first lane) writes the SM's
    clock, less the block's start, at each event of ``TRACE_EVENTS`` of every chunk: the warpgroups' timeline, read
    by ``results/tuning/run147-trace.py``."""
    assert not (trace and (varlen or final_state or runs)), "trace: dense batches, ht free for the trace"
    assert not (runs and varlen), "runs: dense batches"
    assert whole_stores or not v_in_registers, "v_in_registers: with whole_stores"
    assert whole_stores or not chain_scales_keys, "chain_scales_keys: with whole_stores"
    assert not (chain_scales_keys and (chain_first >= 2 or gates_inverse)), "chain_scales_keys: alone in the chain"
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    HQ = T.dynamic("HQ")
    C, BV = chunk_size, block_dv
    NV = T.ceildiv(DV, BV)
    NC = T.ceildiv(S, C)                             # dense: the chunks of a sequence
    G_len = T.dynamic("G_len") if varlen else NC * C   # varlen: C rows per chunk of the chunk table
    N, NG = T.dynamic("N"), T.dynamic("NG")
    BB = 1 if varlen else B
    GB, GL = (T.dynamic("GB"), T.dynamic("GL")) if runs else (BB, G_len)     # G's rows: runs, or sequences
    states = N if varlen else GB

    @T.macro
    def body(Q, K, V, Tb, G, scale, h0, O, ht, bv, bh, bb, gb, n_first, n_count, seq, blk):
        """Value columns ``bv`` of head ``bh``, sequences ``n_first .. n_first + n_count - 1`` of batch
        row ``bb``, their gates in ``G``'s row ``gb``; ``seq(n)`` gives sequence ``n``'s first token, end, first
        chunk and chunk count.
        ``j`` counts the block's chunks over all its sequences: slots and barrier phases follow it."""
        dv0 = bv * BV
        hq = bh // value_groups if value_groups > 1 else bh
        q_s = T.alloc_shared([2, C, DK], dtype)          # two slots: the block's chunk j in slot j % 2
        k_s = T.alloc_shared([2, C, DK], dtype)
        v_s = T.alloc_shared([2, C, BV], dtype)          # V (then X, unless whole_stores)
        tb_s = T.alloc_shared([2, C, C], dtype)
        G_s = T.alloc_shared([2, C], ACCUM)
        E_s = T.alloc_shared([2, C], ACCUM)              # 2^G
        R_s = T.alloc_shared([2, C], ACCUM)              # 2^(G_last - G), 0 past the sequence
        S_s = T.alloc_shared([DK, BV], dtype)
        vd_s = T.alloc_shared([C, BV], dtype)            # V_new, for the output
        vn_s = T.alloc_shared([C, BV], dtype)            # (X with whole_stores, then) V' for the chain
        if chain_scales_keys:
            kr_s = T.alloc_shared([C, DK], dtype)        # 2^(G_last - G) K, the chain's
        if gates_inverse:
            tg_s = T.alloc_shared([C, C], dtype)         # Tb gated by warpgroup 1
        # P gated: the A operand of P V_new from registers, or a shared tile
        p_g = T.alloc_fragment([C, C], dtype) if p_in_registers else T.alloc_shared([C, C], dtype)
        o_s = T.alloc_shared([C, BV], dtype)
        S_f = T.alloc_fragment([DK, BV], ACCUM)
        KS = T.alloc_fragment([C, BV], ACCUM)
        if v_in_registers:
            V_c = T.alloc_fragment([C, BV], dtype)       # V, read before S is ready
        if whole_stores:
            # V's slots are read only element by element there, and tilelang would keep them row by row: a warp's
            # eight rows on the same banks (256-byte rows). Swizzled, as the GEMM operands are, they are not.
            T.annotate_layout({v_s: make_swizzled_layout(v_s)})
        VD = T.alloc_fragment([C, BV], ACCUM)
        P_f = T.alloc_fragment([C, C], ACCUM)
        O_f = T.alloc_fragment([C, BV], ACCUM)
        data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
        data_free = T.alloc_barrier(arrive_count=[384, 384])     # the three warpgroups
        s_ready = T.alloc_barrier(arrive_count=128)              # chain -> warpgroups 1, 2
        s_free = T.alloc_barrier(arrive_count=256)               # warpgroups 1, 2 -> chain
        if not chain_scales_keys:
            vn_ready = T.alloc_barrier(arrive_count=128)         # warpgroup 1 -> chain
        vd_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> output
        vd_free = T.alloc_barrier(arrive_count=256 if chain_scales_keys else 128)  # output (and chain) -> wg 1
        if chain_first >= 1:
            ks_done = T.alloc_barrier(arrive_count=128)          # warpgroup 1 -> output
        if chain_first >= 2:
            update_done = T.alloc_barrier(arrive_count=128)      # chain -> output
        tx = T.get_thread_binding()
        if trace:
            t_base = T.alloc_local([1], "int64")
            t_base[0] = T.call_extern("int64", "clock64")
        j0 = lambda n: seq(n)[2] - seq(n_first)[2]              # the block's count of chunks before sequence n
        # one code branch per warpgroup; a wait for parity (j + 1) % 2 passes at j = 0 and then waits
        # for the other side's arrival of chunk j - 1
        if tx < 128:                                             # the chain
            T.set_max_nreg(registers[0], 1)
            for s in T.serial(n_count):
                n = n_first + s
                load_state(h0, S_f, n, bh, dv0, initial_state)
                for c in T.serial(seq(n)[3]):
                    j = j0(n) + c
                    slot = j % 2
                    T.barrier_wait(data_ready[slot], (j // 2) % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("chain", "data ready"))
                    T.barrier_wait(s_free, (j + 1) % 2)          # both readers are done with chunk j - 1's
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("chain", "S free"))
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("chain", "S published"))
                    for i, jj in T.Parallel(DK, BV):
                        S_f[i, jj] = S_f[i, jj] * E_s[slot, C - 1]
                    if chain_scales_keys:
                        for i, d in T.Parallel(C, DK):
                            kr_s[i, d] = k_s[slot, i, d] * R_s[slot, i]
                        T.fence_proxy_async()
                        T.barrier_wait(vd_ready, j % 2)
                    else:
                        T.barrier_wait(vn_ready, j % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("chain", "V' ready"))
                    if chain_scales_keys:
                        T.gemm(kr_s, vd_s, S_f, transpose_A=True)
                        T.barrier_arrive(vd_free)
                    else:
                        T.gemm(k_s[slot, :, :], vn_s, S_f, transpose_A=True)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("chain", "K^T V' done"))
                    if chain_first >= 2:
                        # the output is past its wait for chunk j - 1 (so this arrival is never two phases ahead)
                        T.barrier_wait(vd_free, (j + 1) % 2)
                        T.barrier_arrive(update_done)
                    T.barrier_arrive(data_free[slot])
                store_state(S_f, ht, n, bh, dv0, final_state)
        elif tx < 256:                                           # V_new and V'
            T.set_max_nreg(registers[1], 1)
            for s in T.serial(n_count):
                n = n_first + s
                for c in T.serial(seq(n)[3]):
                    j = j0(n) + c
                    slot = j % 2
                    T.barrier_wait(data_ready[slot], (j // 2) % 2)
                    if gates_inverse:                            # while the chain makes S
                        for i, jj in T.Parallel(C, C):
                            tg_s[i, jj] = tb_s[slot, i, jj] * decay_factor(G_s[slot, i] - G_s[slot, jj])
                        T.fence_proxy_async()
                    if v_in_registers:
                        T.copy(v_s[slot, :, :], V_c)
                    T.barrier_wait(s_ready, j % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("values", "S ready"))
                    T.gemm(k_s[slot, :, :], S_s, KS, clear_accum=True)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("values", "K S done"))
                    if chain_first >= 1:
                        T.barrier_arrive(ks_done)
                    T.barrier_arrive(s_free)
                    if whole_stores:
                        # V_new goes out first, so that V' is made over it: KS and VD both held would exceed the
                        # warpgroup's 128 registers (run 140: spills); the output warpgroup freed vd_s long before
                        for i, jj in T.Parallel(C, BV):
                            KS[i, jj] = (V_c[i, jj] if v_in_registers else v_s[slot, i, jj]) - E_s[slot, i] * KS[i, jj]
                        T.copy(KS, vn_s)
                        T.fence_proxy_async()
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "X stored"))
                        if gates_inverse:
                            T.gemm(tg_s, vn_s, VD, clear_accum=True)
                        else:
                            T.gemm(tb_s[slot, :, :], vn_s, VD, clear_accum=True)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "Tb X done"))
                        T.barrier_wait(vd_free, (j + 1) % 2)
                        T.copy(VD, vd_s)
                        T.fence_proxy_async()
                        T.barrier_arrive(vd_ready)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "V_new published"))
                        if not chain_scales_keys:
                            for i, jj in T.Parallel(C, BV):
                                VD[i, jj] = VD[i, jj] * R_s[slot, i]
                            T.copy(VD, vn_s)
                            T.fence_proxy_async()
                            T.barrier_arrive(vn_ready)
                        if trace:                                # (with chain_scales_keys: V_new is V')
                            trace_stamp(ht, t_base, blk, j, ("values", "V' published"))
                    else:
                        for i, jj in T.Parallel(C, BV):
                            v_s[slot, i, jj] = v_s[slot, i, jj] - E_s[slot, i] * KS[i, jj]
                        T.fence_proxy_async()
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "X stored"))
                        if gates_inverse:
                            T.gemm(tg_s, v_s[slot, :, :], VD, clear_accum=True)
                        else:
                            T.gemm(tb_s[slot, :, :], v_s[slot, :, :], VD, clear_accum=True)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "Tb X done"))
                        for i, jj in T.Parallel(C, BV):
                            vn_s[i, jj] = VD[i, jj] * R_s[slot, i]
                        T.fence_proxy_async()
                        T.barrier_arrive(vn_ready)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "V' published"))
                        T.barrier_wait(vd_free, (j + 1) % 2)
                        T.copy(VD, vd_s)
                        T.fence_proxy_async()
                        T.barrier_arrive(vd_ready)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("values", "V_new published"))
                    T.barrier_arrive(data_free[slot])
        elif tx < 384:                                           # the output
            T.set_max_nreg(registers[2], 1)
            for s in T.serial(n_count):
                n = n_first + s
                t_first, t_end, c_first, n_chunks = seq(n)
                for c in T.serial(n_chunks):
                    j = j0(n) + c
                    slot = j % 2
                    t0 = t_first + c * C
                    T.barrier_wait(data_ready[slot], (j // 2) % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "data ready"))
                    T.gemm(q_s[slot, :, :], k_s[slot, :, :], P_f, transpose_B=True, clear_accum=True)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "Q K^T done"))
                    for i, jj in T.Parallel(C, C):
                        p_g[i, jj] = P_f[i, jj] * decay_factor(G_s[slot, i] - G_s[slot, jj]) * \
                            T.if_then_else(jj <= i, scale, 0.0)
                    if not p_in_registers:
                        T.fence_proxy_async()
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "P stored"))
                    T.barrier_wait(s_ready, j % 2)
                    if chain_first >= 1:
                        T.barrier_wait(ks_done, j % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "S ready"))
                    T.gemm(q_s[slot, :, :], S_s, O_f, clear_accum=True)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "Q S done"))
                    T.barrier_arrive(s_free)
                    for i, jj in T.Parallel(C, BV):
                        O_f[i, jj] = O_f[i, jj] * (scale * E_s[slot, i])
                    T.barrier_wait(vd_ready, j % 2)
                    if chain_first >= 2:
                        T.barrier_wait(update_done, j % 2)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "V_new ready"))
                    T.gemm(p_g, vd_s, O_f)
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "P V_new done"))
                    T.barrier_arrive(vd_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(O_f, o_s)
                    if varlen:                                   # the tile's rows past the end are the next one's
                        for i, jj in T.Parallel(C, BV):
                            if t0 + i < t_end:
                                O[bb, t0 + i, bh, dv0 + jj] = o_s[i, jj]
                    else:
                        T.copy(o_s, O[bb, t0:t0 + C, bh, dv0:dv0 + BV])
                    if trace:
                        trace_stamp(ht, t_base, blk, j, ("output", "O stored"))
        else:                                                    # the producer warp
            T.set_max_nreg(registers[3], 0)
            if tx < 416:
                lane = tx - 384
                for s in T.serial(n_count):
                    n = n_first + s
                    t_first, t_end, c_first, n_chunks = seq(n)
                    for c in T.serial(n_chunks):
                        j = j0(n) + c
                        slot = j % 2
                        t0 = t_first + c * C
                        T.barrier_wait(data_free[slot], (j // 2 + 1) % 2)
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("producer", "slot free"))
                        rows = slice(t0, t0 + C)
                        T.tma_copy(Q[bb, rows, hq, :], q_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(K[bb, rows, hq, :], k_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], v_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(Tb[bb, rows, bh, :], tb_s[slot, :, :], barrier=data_ready[slot])
                        g0 = (c_first + c) * C                   # the chunk's cumsum in G
                        g_last = G[gb, bh, g0 + C - 1]           # flat past the end: the last row's
                        for r in T.unroll(C // 32):              # the warp's 32 lanes, C rows
                            i = lane + 32 * r
                            G_s[slot, i] = G[gb, bh, g0 + i]
                            E_s[slot, i] = T.exp2(G[gb, bh, g0 + i])
                            R_s[slot, i] = T.exp2(g_last - G[gb, bh, g0 + i]) * real(t0 + i < t_end)
                        T.barrier_arrive(data_ready[slot])
                        if trace:
                            trace_stamp(ht, t_base, blk, j, ("producer", "loads issued"))

    table = lambda rows: [rows] if varlen else [1]

    @T.prim_func
    def main(
        Q: T.Tensor([BB, S, HQ, DK], dtype),
        K: T.Tensor([BB, S, HQ, DK], dtype),
        V: T.Tensor([BB, S, H, DV], dtype),
        Tb: T.Tensor([BB, S, H, C], dtype),
        G: T.Tensor([GB, H, GL], ACCUM),
        scale: T.float32,
        first_chunk: T.int32,
        h0: T.Tensor(state_shape(initial_state, states, H, DK, DV), ACCUM),
        O: T.Tensor([BB, S, H, DV], dtype),
        ht: T.Tensor([B * H * NV, NC, len(TRACE_EVENTS)] if trace else state_shape(final_state, states, H, DK, DV),
                     ACCUM),
        cu_seqlens: T.Tensor(table(N + 1), "int32"),
        chunk_offsets: T.Tensor(table(N + 1), "int32"),
        seq_groups: T.Tensor(table(NG + 1), "int32"),
    ):
        with T.Kernel(NV, H, NG if varlen else GB, threads=512) as (bv, bh, lane):
            # runs: the run's chunks counted once, into a register; as an expression in each warpgroup's loop it held
            # three more there (12 bytes of spills)
            chunks_r = T.alloc_local([1], "int32") if runs else None
            if varlen:                  # lane: a group of packed sequences
                body(Q, K, V, Tb, G, scale, h0, O, ht, bv, bh, 0, 0, seq_groups[lane],
                     seq_groups[lane + 1] - seq_groups[lane],
                     lambda n: (cu_seqlens[n], cu_seqlens[n + 1], chunk_offsets[n],
                                chunk_offsets[n + 1] - chunk_offsets[n]), 0)
            elif runs:                  # lane: run lane % P of batch row lane // P (P = GB / B; C's / and %: all >= 0,
                                        # where tilelang's // and % branch on the signs)
                chunks_r[0] = run_chunks(T.truncmod(lane, T.truncdiv(GB, B)), GL, S, C)
                body(Q, K, V, Tb, G, scale, h0, O, ht, bv, bh, T.truncdiv(lane, T.truncdiv(GB, B)), lane, lane, 1,
                     lambda n: run_span(T.truncmod(lane, T.truncdiv(GB, B)), GL, S, first_chunk, C, chunks_r[0]), 0)
            else:                       # lane: a batch row, one sequence
                body(Q, K, V, Tb, G, scale, h0, O, ht, bv, bh, lane, lane, lane, 1,
                     lambda n: (first_chunk * C, S, first_chunk, NC - first_chunk), (lane * H + bh) * NV + bv)

    return main


# Warpgroups run their branches at once: no two shared buffers may share bytes (build.WARP_SPECIALISED).
inverse_state_output_pass.pass_configs = WARP_SPECIALISED
# --8<-- [end:inverse_state_output_pass]



# --8<-- [start:single_chunk_output]
def single_chunk_output(DK, DV, chunk_size=64, block_dv=64, dtype="bfloat16", value_groups=1, initial_state=False,
                        final_state=False, threads=128, gates_inverse=False):
    """``inverse_state_output_pass`` for packed sequences of at most one chunk each, with its arguments (its
    ``first_chunk`` and ``seq_groups`` not read): one block per (value block, head, sequence) and no chain. The pass
    carries the sequences of a group one after another through four warpgroups and their barriers, so a short
    sequence costs it a whole chunk's latency on one block per SM (1024 sequences of 1 to 64 tokens: 1.63 ms of its
    time against 0.58 for the same tokens as one sequence, run 143). Here every sequence is a small block of its own,
    several per SM: ``V_new = Tb (V - 2^G (K S0))``, the output ``scale (2^G (Q S0) + causal(Q K^T 2^(G_i - G_j))
    V_new)`` and ``S = 2^G_last S0 + K^T (2^(G_last - G) V_new)``, the pass's products in its dtypes (``S0``,
    ``X`` and ``V_new`` rounded to ``dtype`` as GEMM operands). Without ``initial_state`` the ``S0`` terms are
    left out. An empty sequence's final state is its initial one. ``gates_inverse``: ``Tb`` is the gate-free inverse,
    gated here as the pass does."""
    S, H, HQ = T.dynamic("T"), T.dynamic("H"), T.dynamic("HQ")
    N, NG, G_len = T.dynamic("N"), T.dynamic("NG"), T.dynamic("G_len")
    C, BV = chunk_size, block_dv

    @T.prim_func
    def main(
        Q: T.Tensor([1, S, HQ, DK], dtype),
        K: T.Tensor([1, S, HQ, DK], dtype),
        V: T.Tensor([1, S, H, DV], dtype),
        Tb: T.Tensor([1, S, H, C], dtype),
        G: T.Tensor([1, H, G_len], ACCUM),
        scale: T.float32,
        first_chunk: T.int32,                           # not read: the pass's argument list
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
            hq = bh // value_groups if value_groups > 1 else bh
            t0 = cu_seqlens[n]
            L = cu_seqlens[n + 1] - t0
            g0 = chunk_offsets[n] * C                    # the chunk's cumsum in G
            q_s = T.alloc_shared([C, DK], dtype)
            k_s = T.alloc_shared([C, DK], dtype)
            v_s = T.alloc_shared([C, BV], dtype)
            tb_s = T.alloc_shared([C, C], dtype)
            tg_s = T.alloc_shared([C, C], dtype) if gates_inverse else tb_s   # Tb gated (gates_inverse)
            p_s = T.alloc_shared([C, C], dtype)
            x_s = T.alloc_shared([C, BV], dtype)          # X, then 2^(G_last - G) V_new for the state
            vd_s = T.alloc_shared([C, BV], dtype)         # V_new, then the output tile
            G_s = T.alloc_shared([C], ACCUM)
            E_s = T.alloc_shared([C], ACCUM)              # 2^G
            R_s = T.alloc_shared([C], ACCUM)              # 2^(G_last - G), 0 past the sequence
            P_f = T.alloc_fragment([C, C], ACCUM)
            KS = T.alloc_fragment([C, BV], ACCUM)
            VD = T.alloc_fragment([C, BV], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            if final_state:                                  # the state in registers only where one is written
                S_f = T.alloc_fragment([DK, BV], ACCUM)
                load_state(h0, S_f, n, bh, dv0, initial_state)
            if initial_state:                                # S0 as the GEMMs' operand, rounded as the pass does
                S_s = T.alloc_shared([DK, BV], dtype)
                T.copy(h0[n, bh, :, dv0:dv0 + BV], S_s)
            if L > 0:
                # rows past the sequence are the next one's (or zeros past T): Tb's columns there are 0, the causal
                # mask keeps them out of the stored rows and R_s out of the state
                T.copy(Q[0, t0:t0 + C, hq, :], q_s)
                T.copy(K[0, t0:t0 + C, hq, :], k_s)
                T.copy(V[0, t0:t0 + C, bh, dv0:dv0 + BV], v_s)
                T.copy(Tb[0, t0:t0 + C, bh, :], tb_s)
                g_last = G[0, bh, g0 + C - 1]                # flat past the end: the last row's
                for i in T.Parallel(C):
                    G_s[i] = G[0, bh, g0 + i]
                    E_s[i] = T.exp2(G[0, bh, g0 + i])
                    R_s[i] = T.exp2(g_last - G[0, bh, g0 + i]) * real(i < L)
                T.gemm(q_s, k_s, P_f, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    p_s[i, j] = P_f[i, j] * decay_factor(G_s[i] - G_s[j]) * T.if_then_else(j <= i, scale, 0.0)
                if gates_inverse:
                    for i, j in T.Parallel(C, C):
                        tg_s[i, j] = tb_s[i, j] * decay_factor(G_s[i] - G_s[j])
                if initial_state:
                    T.gemm(k_s, S_s, KS, clear_accum=True)
                    for i, j in T.Parallel(C, BV):
                        x_s[i, j] = v_s[i, j] - E_s[i] * KS[i, j]
                    T.gemm(tg_s, x_s, VD, clear_accum=True)
                    T.copy(VD, vd_s)
                    T.gemm(q_s, S_s, O_f, clear_accum=True)
                    for i, j in T.Parallel(C, BV):
                        O_f[i, j] = O_f[i, j] * (scale * E_s[i])
                    T.gemm(p_s, vd_s, O_f)
                else:
                    T.gemm(tg_s, v_s, VD, clear_accum=True)
                    T.copy(VD, vd_s)
                    T.gemm(p_s, vd_s, O_f, clear_accum=True)
                if final_state:
                    for i, j in T.Parallel(C, BV):
                        VD[i, j] = VD[i, j] * R_s[i]
                    T.copy(VD, x_s)
                    for i, j in T.Parallel(DK, BV):
                        S_f[i, j] = S_f[i, j] * T.exp2(g_last)
                    T.gemm(k_s, x_s, S_f, transpose_A=True)
                T.copy(O_f, vd_s)
                for i, j in T.Parallel(C, BV):
                    if i < L:
                        O[0, t0 + i, bh, dv0 + j] = vd_s[i, j]
            if final_state:
                store_state(S_f, ht, n, bh, dv0, final_state)

    return main
# --8<-- [end:single_chunk_output]

# --8<-- [start:token_value_checks]
def token_value_checks(DK, block_rows=64, dtype="bfloat16", gate_dtype="float32", beta_dtype="float32",
                       value_groups=1, check_keys=False, threads=128):
    """The value checks of GDN's first kernels in a kernel of their own, for a path whose one kernel makes every
    output (``packed_tile_output``): the host, which waits for the checks, then waits for this kernel alone and
    returns while the outputs are made, instead of after them. Arguments at run time: ``K [1, T, HQ, DK]``
    (dtype), ``g [1, T, H]`` (``gate_dtype``), ``beta [1, T, H]`` (``beta_dtype``), then ``flags`` (``[2]``, ``[3]``
    with ``check_keys``): ``flags[0]`` a gate not finite or above 0, ``flags[1]`` a ``beta`` outside ``[0, 1]``,
    ``flags[2]`` a key past the delta rule's bound (``b ||k||^2 > KEY_BOUND``, squares summed in float32). One block
    per ``block_rows`` tokens of a value head; the keys are the one large read (as many bytes as ``k``)."""
    S, H, HQ = T.dynamic("T"), T.dynamic("H"), T.dynamic("HQ")
    R = block_rows

    @T.prim_func
    def main(
        K: T.Tensor([1, S, HQ, DK], dtype),
        g: T.Tensor([1, S, H], gate_dtype),
        beta: T.Tensor([1, S, H], beta_dtype),
        flags: T.Tensor([3 if check_keys else 2], "int32"),
    ):
        with T.Kernel(T.ceildiv(S, R), H, threads=threads) as (bt, bh):
            b_s = T.alloc_shared([R], ACCUM)
            load_beta_checked(beta, b_s, flags, bt * R, T.min(R, S - bt * R), R, 0, bh)
            for i in T.Parallel(R):
                if bt * R + i < S:
                    x = T.Cast(ACCUM, g[0, bt * R + i, bh])
                    if real(x <= 0.0) * real(x >= -FLOAT32_MAX) == 0.0:        # NaN fails both
                        flags[0] = 1
            if check_keys:
                k_s = T.alloc_shared([R, DK], dtype)
                norm_f = T.alloc_fragment([R, NORM_SLICE], ACCUM)
                sum_f = T.alloc_fragment([R], ACCUM)
                T.copy(K[0, bt * R:bt * R + R, bh // value_groups if value_groups > 1 else bh, :], k_s)
                row_square_sums(k_s, norm_f, sum_f, R, DK)
                for i in T.Parallel(R):
                    if bt * R + i < S and sum_f[i] * b_s[i] > KEY_BOUND:
                        flags[2] = 1

    return main
# --8<-- [end:token_value_checks]


# --8<-- [start:packed_tile_output]
def packed_tile_output(DK, DV, chunk_size=64, block=16, dtype="bfloat16", gate_dtype="float32", beta_dtype="float32",
                       value_groups=1, threads=128, check_keys=False, early_scores=False, gathered=False,
                       compact=False):
    """GDN's whole forward for packed sequences of at most one chunk each, with no initial and no final states, in one
    kernel: tiles of ``C`` rows of the packed tokens, each holding whole sequences (``packed.sequence_tiles``), one
    block per (tile, head). Without states a sequence that fits a tile needs nothing from outside it: ``V_new = Tb V``
    and ``O = scale causal(Q K^T 2^(G_i - G_j)) V_new``, with every pair of two sequences of the tile masked away (in
    ``A``, so that ``Tb`` is block-diagonal, and in the scores). ``G`` runs over the whole tile: for two rows of one
    sequence ``G_i - G_j`` sums that sequence's gates alone. The chunk table's own path gives every sequence a chunk
    of its own and carries the chunks through the sequential pass: 1024 sequences of 1 to 64 tokens took 1.89 ms
    there against 0.77 for the same tokens as one sequence (run 151, H100).

    Arguments at run time: ``Q, K [1, T, HQ, DK]``, ``V [1, T, H, DV]`` (dtype), ``g [1, T, H]`` (``gate_dtype``,
    natural log), ``beta [1, T, H]`` (``beta_dtype``), ``starts [T]`` (int32: the first token of each token's
    sequence), ``tiles [NT, 2]`` (int32: each tile's first token and length), ``rows [NT, C]`` (int32: the token of
    each tile row, with ``gathered``; else a ``[1, 1]`` stand-in, not read), ``scale``, then the outputs ``O [1, T,
    H, DV]`` and ``flags`` (``chunk_gated_inverse``'s value checks, ``[3]`` with ``check_keys``). ``early_scores``:
    ``Q K^T``'s masked scores in a tile of their own right after ``K K^T``, so that the tiles of ``q`` and ``k`` are
    spent before the solve and their bytes reused (70 KB of shared memory against 95: three blocks per SM).
    ``gathered``: each tile's rows read and written through ``rows`` (``packed.sequence_rows``: whole sequences
    packed by best fit, not in order), so that the tiles are nearly full: in order, a tile ends where the next
    sequence does not fit, and run 140's 1024 sequences of 1 to 64 tokens fill 696 tiles to 75%; by best fit 532,
    for 526 chunks of the same tokens as one sequence. ``compact``: the least shared memory live at once, so that more
    blocks share an SM (the kernel waits on its chain of small steps, not on HBM): the scores first (q's tile spent
    before ``A`` is made), ``v``'s tile loaded after the solve, the merge's scratch in ``A_s``'s spent quadrants
    (``chunk_gated_inverse``'s compact form)."""
    S, H, HQ = T.dynamic("T"), T.dynamic("H"), T.dynamic("HQ")
    NT = T.dynamic("NT")
    C = chunk_size
    assert C == 4 * block, "the merge by halves"

    @T.macro
    def masked_scores(q_s, k_s, G_s, seq_s, P_s, CC, scale):
        """``P = scale causal(Q K^T 2^(G_i - G_j))`` over the pairs of one sequence."""
        T.gemm(q_s, k_s, CC, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):
            P_s[i, j] = CC[i, j] * decay_factor(G_s[i, 0] - G_s[j, 0]) * \
                T.if_then_else((j <= i) & (seq_s[i] == seq_s[j]), scale, 0.0)

    @T.macro
    def load_values(V, v_s, rows_s, t0, bh):
        if gathered:
            for i, j in T.Parallel(C, DV):
                v_s[i, j] = V[0, rows_s[i], bh, j]
        else:
            T.copy(V[0, t0:t0 + C, bh, :], v_s)

    @T.macro
    def tile_output(Q, K, V, g, beta, starts, rows, scale, O, flags, nt, t0, L, bh, q_s, k_s, v_s, g_s, H_s, G_s, b_s,
                    seq_s, rows_s, A_s, Tinv_s, Tb_s, P_s, vn_s, CC, VD, x_col):
        hq = bh // value_groups if value_groups > 1 else bh
        # rows past L: the next tile's tokens, or zeros past T (gathered: the last token again); b = 0 there keeps
        # them out of V_new's rows below L, and the causal mask out of the scores' rows below L
        if gathered:
            for i in T.Parallel(C):
                rows_s[i] = rows[nt, i]
            for i, j in T.Parallel(C, DK):
                q_s[i, j] = Q[0, rows_s[i], hq, j]
                k_s[i, j] = K[0, rows_s[i], hq, j]
        else:
            T.copy(Q[0, t0:t0 + C, hq, :], q_s)
            T.copy(K[0, t0:t0 + C, hq, :], k_s)
        if not compact:
            load_values(V, v_s, rows_s, t0, bh)
        load_beta_checked(beta, b_s, flags, t0, L, C, 0, bh, rows_s)
        log2_cumsum_by_scan(g, g_s, H_s, G_s, flags, 0, bh, t0, L, C, rows_s)
        for i in T.Parallel(C):
            seq_s[i] = starts[row_token(t0, i, L, rows_s)]
        if compact:                                      # q spent before A is made
            masked_scores(q_s, k_s, G_s, seq_s, P_s, CC, scale)
        T.gemm(k_s, k_s, CC, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):                    # pairs of one sequence only
            A_s[i, j] = CC[i, j] * b_s[i] * decay_factor(G_s[i, 0] - G_s[j, 0]) * real(j < i) * \
                real(seq_s[i] == seq_s[j])
            if check_keys:
                if i == j and CC[i, j] * b_s[i] > KEY_BOUND:
                    flags[2] = 1
        if early_scores and not compact:                 # q and k done with before the solve
            masked_scores(q_s, k_s, G_s, seq_s, P_s, CC, scale)
        invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, block)
        merge_by_halves(A_s, Tinv_s, C, block, in_place=compact)
        for i, j in T.Parallel(C, C):                    # the blocks above the diagonal were never written
            Tb_s[i, j] = T.if_then_else(i // block >= j // block, Tinv_s[i, j] * b_s[j], 0.0)
        if compact:                                      # v's tile live from here on only
            load_values(V, v_s, rows_s, t0, bh)
        T.gemm(Tb_s, v_s, VD, clear_accum=True)          # V_new
        T.copy(VD, vn_s)
        if not (early_scores or compact):
            masked_scores(q_s, k_s, G_s, seq_s, P_s, CC, scale)
        T.gemm(P_s, vn_s, VD, clear_accum=True)
        T.copy(VD, vn_s)
        for i, j in T.Parallel(C, DV):
            if i < L:
                O[0, rows_s[i] if gathered else t0 + i, bh, j] = vn_s[i, j]

    @T.prim_func
    def main(
        Q: T.Tensor([1, S, HQ, DK], dtype),
        K: T.Tensor([1, S, HQ, DK], dtype),
        V: T.Tensor([1, S, H, DV], dtype),
        g: T.Tensor([1, S, H], gate_dtype),
        beta: T.Tensor([1, S, H], beta_dtype),
        starts: T.Tensor([S], "int32"),
        tiles: T.Tensor([NT, 2], "int32"),
        rows: T.Tensor([NT, C] if gathered else [1, 1], "int32"),
        scale: T.float32,
        O: T.Tensor([1, S, H, DV], dtype),
        flags: T.Tensor([3 if check_keys else 2], "int32"),
    ):
        with T.Kernel(NT, H, threads=threads) as (nt, bh):
            q_s = T.alloc_shared([C, DK], dtype)
            k_s = T.alloc_shared([C, DK], dtype)
            v_s = T.alloc_shared([C, DV], dtype)
            g_s = T.alloc_shared([C, 1], ACCUM)
            H_s = T.alloc_shared([C, 1], ACCUM)              # the scan's scratch
            G_s = T.alloc_shared([C, 1], ACCUM)
            b_s = T.alloc_shared([C], ACCUM)
            seq_s = T.alloc_shared([C], "int32")              # each row's sequence, by its first token
            rows_s = T.alloc_shared([C], "int32") if gathered else None     # each row's token
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            # the scores: in Tb's tile once V_new is made (two blocks per SM: 104 KB), a tile of their own where
            # they are made before the solve
            P_s = T.alloc_shared([C, C], dtype) if early_scores or compact else Tb_s
            vn_s = T.alloc_shared([C, DV], dtype)            # V_new, then the output
            CC = T.alloc_fragment([C, C], ACCUM)
            VD = T.alloc_fragment([C, DV], ACCUM)
            x_col = T.alloc_local([block], ACCUM)
            tile_output(Q, K, V, g, beta, starts, rows, scale, O, flags, nt, tiles[nt, 0], tiles[nt, 1], bh, q_s, k_s,
                        v_s, g_s, H_s, G_s, b_s, seq_s, rows_s, A_s, Tinv_s, Tb_s, P_s, vn_s, CC, VD, x_col)

    return main

# --8<-- [end:packed_tile_output]


# ---- the launchers ----

# chunk_gated_inverse's arrangement beyond its defaults (chunks per block, stages, blocks per SM): run 90 timed ten
# (results/tuning/run90-gdn-inverse.py); the defaults are its best. Run 111 (H100): the merge by halves (tf32 GEMMs for
# the lower-left 32 x 32 block) passed its GPU tests and takes 0.272 ms against 0.340 at (1, 8192, 96, 128), the op
# 0.801 against 0.876 (FlashQLA 0.592). The cumsum by doubling scan passed its stage tests in run 113 (H100) after its
# rows past a ragged chunk's end were made flat; with it the inverse took 0.249 ms and the op 0.767 in run 112. Run 135
# (H100): compact (the merge's scratch and Tb's tile in A_s, 49.5 KB of shared memory, four blocks per SM) passed its
# GPU tests (the stage against float64, the op dense and packed) with G and Tb bit for bit the default's, and took the
# inverse from 0.332 to 0.275 ms at (1, 32768, 32, 128) (FlashQLA's kkt_solve 0.230; the op 0.952 to 0.886, FlashQLA
# 0.744) and from 0.250 to 0.212 at (1, 8192, 96, 128) (kkt_solve 0.176; the op 0.776 to 0.729, FlashQLA 0.591).
# On for the dtypes in COMPACT_DTYPES (COMPACT_INVERSE over the config above): fp16's compact G and Tb came out bit for
# bit fp16's default arrangement's, dense and packed, in run 139 (H100), so fp16 takes it too.
SCALAR_GATE_INVERSE_CONFIG: dict = dict(merge="halves", cumsum="scan")
COMPACT_INVERSE: dict = dict(compact=True, min_blocks=4)
COMPACT_DTYPES = ("bfloat16", "float16")


# beta's dtypes chunk_gated_inverse and packed_tile_output read as they are with BETA_IN_ITS_DTYPE (the op's beta is
# often the inputs' dtype, and its float32 copy a launch and a pass over it); others are made float32 first. The
# GPU test passed (run 153, H100: test_beta_in_its_dtype_same_bits, the same outputs as from beta made float32, bit
# for bit, dense and packed): on, one launch and a pass over beta fewer a call.
BETA_DTYPES = (torch.bfloat16, torch.float16)
BETA_IN_ITS_DTYPE = True


def kernel_beta(beta: torch.Tensor) -> torch.Tensor:
    """``beta`` as the scalar-gate kernels read it: as it is where ``BETA_IN_ITS_DTYPE`` takes its dtype, else in
    float32 (contiguous either way)."""
    keep = BETA_IN_ITS_DTYPE and beta.dtype in BETA_DTYPES
    return (beta if keep else beta.to(torch.float32)).contiguous()


def scalar_gate_inverse(k, g, beta, H, flags=None, table=None, runs=1, gate_free=None):
    """``chunk_gated_inverse`` over every chunk (of the packed sequences of ``table``): ``(G [B, H, NC C],
    Tb [B, T, H, C])``, ``g [B, T, H(, 1)]``, ``H`` the value heads; dense, ``runs`` gives ``G [B runs, H, L]``,
    each sequence's runs of ``L / C = ceil(NC / runs)`` whole chunks (the last may be short) in rows of their own, as
    the split's pass reads them; ``flags`` (int32 ``[2]``, zeroed)
    collects its value checks of ``g`` and ``beta``, ``[3]`` those of the keys too (``check_keys``). With
    ``GATE_FREE_INVERSE`` (or ``gate_free``, where given) ``Tb`` is the inverse without the gate, for
    ``scalar_gate_pass_launch`` to gate (told the same)."""
    from kda.kernels.build import compile_program

    B, T, HQ, DK = k.shape
    C = CHUNK_SIZE
    NC = ceildiv(T, C) if table is None else table.chunks.shape[0]
    dtype = launch.dtype_name(k.dtype)
    config = {**SCALAR_GATE_INVERSE_CONFIG, **(COMPACT_INVERSE if dtype in COMPACT_DTYPES else {})}
    beta = kernel_beta(beta)
    with torch.cuda.device(k.device):
        inverse = compile_program(chunk_gated_inverse, (), DK=DK, chunk_size=C, dtype=dtype,
                                  gate_dtype=str(g.dtype).removeprefix("torch."), value_groups=H // HQ,
                                  varlen=table is not None, **config, **launch.keys_checked(flags),
                                  **({"gate_free": True} if (GATE_FREE_INVERSE if gate_free is None else gate_free)
                                     else {}),
                                  **({"beta_dtype": str(beta.dtype).removeprefix("torch.")}
                                     if beta.dtype != torch.float32 else {}))
        chunks_per_run = ceildiv(NC, runs)
        if runs != 1 and (table is not None or (runs - 1) * chunks_per_run >= NC):
            raise ValueError(f"runs must cut the {NC} chunks of a dense batch into runs of ceil({NC} / runs) chunks, "
                             f"none empty, got {runs}")
        G = launch.new_output((B * runs, H, chunks_per_run * C), torch.float32, k.device)
        Tb = launch.new_output((B, T, H, C), k.dtype, k.device)
        if flags is None:
            flags = torch.zeros(2, dtype=torch.int32, device=k.device)
        chunks = table.chunks if table is not None else launch.stand_in(2, torch.int32, k.device)
        inverse(k.contiguous(), g.reshape(B, T, H).contiguous(), beta.contiguous(), G, Tb, flags,
                chunks)
    return G, Tb


# inverse_state_output_pass with whole_stores (no barrier in any step of warpgroup 1's loops; V's slots swizzled). Its
# GPU test passed on the H200 (run 141: the same bits as the in-place loops, dense and packed). Alone it was no faster
# (run 143, H100: the op at (1, 8192, 96, 128) 0.734 ms against 0.740): the output warpgroup's P loop then held the
# chain back (run 147's trace). With P_IN_REGISTERS it is what makes the pass fast (run 149, below): on.
WHOLE_STORES = True

# inverse_state_output_pass with chain_first (1: the output's Q S waits for warpgroup 1's K S; 2: its P V_new also waits
# for the chain's K^T V'), so that the GEMMs on the chain do not share the tensor cores with the output's. Run 139's
# profile had the pass 25% slower than FlashQLA's fused kernel with fewer instructions: its warps wait more, and the
# 64 barriers a chunk were not it (run 143). The same bits (run 147's GPU tests, H100), and no faster: the pass at
# (1, 8192, 96, 128) 0.503 ms with 1 and 0.516 with 2 against the default's 0.500 (run 147). Off.
CHAIN_FIRST = 0


# inverse_state_output_pass with p_in_registers (the output warpgroup's P gated in registers, the A operand of P V_new)
# and, with WHOLE_STORES, v_in_registers (warpgroup 1 reads V into registers off the chain; V's slots swizzled). Run
# 147's trace (H100, (1, 8192, 96, 128)): of a chunk's 7,500 cycles the output's P loop took 3,400 and warpgroup 1's
# X loop 1,760 to 2,500 (eight-way bank conflicts: V's slots kept row by row). The same products on the same bf16
# operands: run 149's GPU tests (H100) found the op's outputs equal to the default's bit for bit, dense and packed.
# Run 149 (H100), the op: at (1, 8192, 96, 128) 0.741 ms by the old default, 0.743 with P alone, 0.569 with
# WHOLE_STORES and P, 0.565 with V as well (the pass 0.516 -> 0.343); at (1, 32768, 32, 128) 1.057, 0.893, 0.798,
# 0.791. FlashQLA 0.588 and 0.754. On.
P_IN_REGISTERS = True
V_IN_REGISTERS = True

# inverse_state_output_pass with chain_scales_keys (with WHOLE_STORES): the chain scales the keys by 2^(G_last - G)
# while it waits and reads V_new, so that warpgroup 1 makes no V' (run 147: 440 cycles of the chain's). Rounds the
# scale on the keys instead of on V': its GPU tests (run 149, H100) held it to the recurrence and within 5e-3 of the
# default, dense and packed. The op (run 149) 0.551 ms at (1, 8192, 96, 128) against 0.565 without it (FlashQLA 0.588),
# 0.790 against 0.791 at (1, 32768, 32, 128) (FlashQLA 0.754). On.
CHAIN_SCALES_KEYS = True

# The (dtype, DK, block_dv) the four forms above have passed their GPU tests with (run 149: bf16, 128 key and 128 value
# columns; run 150: fp16 with 128, bf16 with 64, dense and packed). Other arrangements keep the in-place form until
# theirs have run. Run 150 (H100) timed fp16 at (1, 8192, 96, 128): 0.548 ms against 0.729 in place.
REGISTER_FORMS_TESTED = (("bfloat16", 128, 128), ("float16", 128, 128), ("bfloat16", 64, 64))


def pass_forms(dtype: str, DK: int, block_dv: int, gates_inverse: bool = False) -> dict:
    """The forms of ``inverse_state_output_pass`` a launch takes (its parameters beyond the shapes): ``WHOLE_STORES``,
    ``P_IN_REGISTERS``, ``V_IN_REGISTERS`` and ``CHAIN_SCALES_KEYS`` where ``(dtype, DK, block_dv)`` is one of
    ``REGISTER_FORMS_TESTED``, and ``CHAIN_FIRST``; ``gates_inverse``: the pass gates the inverse (no
    ``chain_scales_keys`` then)."""
    forms = {"chain_first": CHAIN_FIRST} if CHAIN_FIRST else {}
    if (dtype, DK, block_dv) not in REGISTER_FORMS_TESTED:
        return forms
    wanted = {"whole_stores": WHOLE_STORES, "p_in_registers": P_IN_REGISTERS,
              "v_in_registers": V_IN_REGISTERS and WHOLE_STORES,
              "chain_scales_keys": CHAIN_SCALES_KEYS and WHOLE_STORES and CHAIN_FIRST < 2 and not gates_inverse}
    return {**forms, **{name: True for name, on in wanted.items() if on}}


# The first kernel's inverse without the gate (chunk_gated_inverse(gate_free=True): no exponential of a pair there),
# gated by the pass's warpgroup 1 while it waits for the chain's state, and by single_chunk_output (gates_inverse):
# FlashQLA's split of the work. Read by scalar_gate_inverse and scalar_gate_pass_launch at each call, so the two agree.
# Its GPU tests passed (run 147, H100); off, slower: the first kernel 0.190 ms against 0.210 at (1, 8192, 96, 128), but
# the pass gating the tile 0.561 against 0.500 (warpgroup 1's gating loop lands on the chain), the op 0.772 against
# 0.736 (2.505 against 2.260 at (1, 32768, 32, 128)). With the register forms (runs 151 and 152, H100) it gains where
# the sequence is split (0.727 against 0.752 ms at (1, 32768, 32)) and loses where it is not (0.596 against 0.551 at
# (1, 8192, 96): its pass 0.389 against 0.324).
GATE_FREE_INVERSE = False


# Packed sequences that all fit one chunk (known on the host: a table from chunk_table) by single_chunk_output, one
# small block per (sequence, head, packed.SINGLE_CHUNK_COLUMNS value columns), instead of the pass. Its GPU tests
# passed (run 147, H100); off, slower: 1024 sequences of 1 to 64 tokens took 2.398 ms against 1.892 by the pass (run
# 151, H100; each block loads a whole chunk's tiles for a few tokens).
SINGLE_CHUNK_OUTPUT = False


def takes_single_chunk_output(table, DV: int) -> bool:
    """Whether the packed sequences of ``table`` go through ``single_chunk_output`` (``SINGLE_CHUNK_OUTPUT``):
    ``packed.fits_one_chunk``."""
    return SINGLE_CHUNK_OUTPUT and packed.fits_one_chunk(table, DV)


# GDN's intra-card split (kda.distributed) with the gate-free inverse while the unsplit op keeps the gated one: run 152
# (H100) had the gate-free inverse faster where the sequence is split (0.727 against 0.752 ms at (1, 32768, 32, 128);
# FlashQLA 0.748) and slower where it is not (0.596 against 0.551 at (1, 8192, 96, 128)). The pass then gates the
# inverse without chain_scales_keys. Its GPU tests passed (run 153, H100: test_split_with_the_gate_free_inverse, plain
# and grouped, and the gate-free inverse's own under today's pass forms): on.
GATE_FREE_IN_SPLIT = True


# Packed sequences of at most one chunk each, with no initial and no final states (the host knows the boundaries) by
# packed_tile_output, the whole forward in one kernel over tiles of whole sequences, instead of a chunk per sequence
# through the inverse and the sequential pass. Run 155 (H100, 32 heads of 128, bf16): 8192 sequences of 1 to 8 tokens
# 1.264 ms against 10.027 (the same tokens as one sequence 1.756, FlashQLA 23.44, fla 17.78), 1024 of 1 to 64 tokens
# 1.365 against 1.402 (one sequence 1.608, FlashQLA 5.97, fla 3.23). Its GPU test's values passed there; the beta
# check failed (the flags were read before its one kernel ran; _run_kernels now launches it first), rerun in run
# 157: on.
PACKED_TILES = True


# packed_tile_output's arrangement beyond its defaults (the scores made after V_new in Tb's tile: 95 KB of shared
# memory, two blocks per SM). early_scores makes Q K^T's scores right after K K^T, so that q's and k's tiles are spent
# before the solve and tilelang's buffer reuse lays the kernel out in 70 KB (three blocks per SM). Run 157 (H100, 32
# heads of 128, bf16): its GPU tests passed (the outputs bit for bit the default's), the kernel 1.014 ms against 1.369
# on 1024 sequences of 1 to 64 tokens, 0.947 against 1.273 on 8192 of 1 to 8; the op 1.153 against 1.537 and 1.570
# against 1.865. Four tiles a block with their loads pipelined (T.Pipelined over the tiles, 122 KB, one block per SM)
# was no faster (1.583) and wrong (0.5 relative L2 from the default: tilelang's reuse of the tiles' buffers across the
# pipeline's stages, not studied further), and was taken out.
# gathered (same day, CPU only, off until run 162's GPU test): the tiles packed by best fit, longest sequences first,
# and read through a row map (packed.sequence_rows), 532 tiles for run 140's 1024 sequences of 1 to 64 tokens
# against 696 in order (526 chunks as one sequence); the loads become gathers of whole rows (16-byte vectors, not
# the bulk copies of contiguous rows).
# compact (same day): scores first, v loaded after the solve, the merge's scratch in A's spent quadrants (41 KB gathered,
# five blocks per SM). Run 162 (H100, 2026-12-07): GPU tests passed for every arrangement; 1024 sequences of 1 to 64
# tokens 0.876 ms gathered and compact against 1.168 for early_scores in order (0.744 as one sequence), 8192 of 1 to 8
# 1.119 against 1.251 (0.990 in order and compact); with the checks first 0.867 and 0.947 (0.969 as one sequence).
PACKED_TILE_CONFIG: dict = dict(gathered=True, compact=True)


def takes_packed_tiles(table, h0, output_final_state: bool, DV: int) -> bool:
    """Whether GDN's packed sequences of ``table`` go through ``packed_tile_output`` (``PACKED_TILES``): the host
    knows their boundaries and that none has more than one chunk, no state comes in or goes out, and the value
    block is whole (``DV <= 128``)."""
    return PACKED_TILES and packed.stateless_known(table, h0, output_final_state, most_chunks=1) and DV <= 128


def packed_tile_launch(q, k, v, g, beta, scale, flags, table, checks_first=False):
    """``packed_tile_output`` over the tiles of ``table``'s sequences (``packed.sequence_tiles``), up to its
    launch: ``(checks, launch, o)``. ``flags`` (zeroed, ``[2]`` or ``[3]``) collects the value checks as
    ``chunk_gated_inverse``'s do. ``checks_first``: ``checks`` queues ``token_value_checks`` over the same
    arguments (the keys too), to be launched before the tile kernel, which is then compiled without the keys'
    check; else ``checks`` is ``None``."""
    from kda.kernels.build import compile_program

    _, T, HQ, DK = q.shape
    H, DV = v.shape[2], v.shape[-1]
    if PACKED_TILE_CONFIG.get("gathered"):
        tiles, rows, starts = packed.sequence_rows(table.bounds, q.device)
    else:
        (tiles, starts), rows = packed.sequence_tiles(table.bounds, q.device), launch.stand_in(2, torch.int32,
                                                                                                q.device)
    k, g, beta = k.contiguous(), g.reshape(1, T, H).contiguous(), kernel_beta(beta).contiguous()
    if flags is None:
        flags = torch.zeros(2, dtype=torch.int32, device=q.device)
    dtypes = dict(dtype=launch.dtype_name(q.dtype), gate_dtype=str(g.dtype).removeprefix("torch."),
                  beta_dtype=str(beta.dtype).removeprefix("torch."), value_groups=H // HQ)
    checks = None
    with torch.cuda.device(q.device):
        kernel = compile_program(packed_tile_output, (), DK=DK, DV=DV, chunk_size=CHUNK_SIZE, **dtypes,
                                 **PACKED_TILE_CONFIG, **({} if checks_first else launch.keys_checked(flags)))
        if checks_first:
            checks = launch.queued(compile_program(token_value_checks, (), DK=DK, **dtypes,
                                                   **launch.keys_checked(flags)), (k, g, beta, flags), q.device)
            flags = flags[:2]                            # g's and beta's flags again: the same values found
    o = launch.new_output((1, T, H, DV), v.dtype, q.device)
    args = (q.contiguous(), k, v.contiguous(), g, beta, starts, tiles, rows, scale, o, flags)
    return checks, launch.queued(kernel, args, q.device), o


# The packed tiles' value checks in a kernel of their own (token_value_checks), queued before the tile kernel: the host
# waits for it alone (a read of k, g and beta) and returns while the tiles are made, so that the next call's host work
# runs under them. Run 160 (H100) had 0.54 ms of each call outside the tile kernel on 1024 short sequences: the host
# waited for the whole kernel, then the GPU for the next call's host. Run 162 (H100): GPU tests passed; the host's
# share of an idle call 0.43 ms against 0.91 (1024 sequences of 1 to 64 tokens), 0.45 against 1.13 (8192 of 1 to 8).
TILE_CHECKS_FIRST = True
# ... and on a stream of their own (validate.check_beside), so that the GPU may run them beside the tile kernel: in run
# 162 they were 0.138 ms in line with its 0.778 (1024 sequences of 1 to 64 tokens), while the call took 0.867 against
# 0.744 for the same tokens as one sequence. Off until its GPU test and timing (run 163).
TILE_CHECKS_BESIDE = False


def scalar_gate_pass_launch(q, k, v, Tb, G, scale, h0, block_dv, table=None, output_final_state=True, first_chunk=0,
                            out=None, final=None, gate_free=None, runs=1):
    """``inverse_state_output_pass`` up to its launch, as ``(launch, o, final state or None)``
    (``state_pass_launch``'s form); one state per sequence (``[N, H, DK, DV]`` with ``table``). Packed sequences of
    at most one chunk each by ``single_chunk_output`` where ``takes_single_chunk_output`` says so, with the same
    arguments. ``Tb`` is gated here where ``GATE_FREE_INVERSE`` (or ``gate_free``, where given) made it without the
    gate. ``first_chunk`` (dense):
    every sequence from that chunk on; ``out`` and ``final``: buffers of the caller's for ``o`` and the final
    states (``launch.pass_held``). ``runs`` (dense): ``G`` is ``scalar_gate_inverse(runs=...)``'s, and each run is a
    sequence of its own (``h0``, the final states and ``first_chunk`` per run)."""
    from kda.kernels.build import compile_program

    B, T, HQ, DK = q.shape
    H, DV = v.shape[2], v.shape[-1]
    device = q.device
    N, _, tables = packed.sequence_tables(table, B, device)
    if runs != 1 and (table is not None or G.shape[0] != B * runs):
        raise ValueError(f"runs: a dense batch and G of B * runs = {B * runs} rows, got {G.shape[0]}")
    params = dict(DK=DK, DV=DV, chunk_size=CHUNK_SIZE, dtype=launch.dtype_name(q.dtype), value_groups=H // HQ,
                 initial_state=h0 is not None, final_state=output_final_state,
                 **({"gates_inverse": True} if (GATE_FREE_INVERSE if gate_free is None else gate_free) else {}),
                 **({"runs": True} if runs != 1 else {}))
    with torch.cuda.device(device):
        if takes_single_chunk_output(table, DV):
            state_pass = compile_program(single_chunk_output, (), block_dv=packed.SINGLE_CHUNK_COLUMNS,
                                         **params)
        else:
            state_pass = compile_program(inverse_state_output_pass, (), block_dv=block_dv, varlen=table is not None,
                                         **params, **pass_forms(params["dtype"], DK, block_dv,
                                                                params.get("gates_inverse", False)))
    return launch.pass_held(state_pass, (q.contiguous(), k.contiguous(), v.contiguous(), Tb, G, scale, first_chunk),
                            h0, output_final_state, (N * runs, H, DK, DV), (B, T, H, DV), v.dtype, device, tables, out,
                            final)
