"""Level 5 public functions, shaped like fla 0.6.0's: ``chunk_kda`` (per-channel gate, KDA) and
``chunk_gated_delta_rule`` (scalar gate, GDN), with variable-length batches through ``cu_seqlens``.

The recurrence (fla's convention, state ``d_k x d_v``)::

    S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T (scale q_t)

On CUDA two kernels, each launched by the function beside it, in two steps that ``kda.distributed``
reuses: ``kda.kernels.chunk_intra.prepare_chunks`` (every chunk at once; a scalar gate takes its scalar
path: one GEMM for the scores, the decay applied after it) and ``kda.kernels.gated_state_pass.run_state_pass``
(sequential); or, for GDN where its blocks fill the SMs, ``kda.kernels.scalar_gate``'s two. On the CPU the
float64 chunked reference of ``kda.reference.level0``. Packed sequences (``cu_seqlens``) go through each
kernel in one launch (``kda.packed.chunk_table``), and through the CPU reference one after another.
``v``, ``g``, ``beta`` and the states may have more heads than ``q`` and ``k`` (grouped value heads, as in
fla): ``HV`` a multiple of ``H``, value head ``i`` reading query and key head ``i // (HV / H)``.
"""

from __future__ import annotations

import torch

from kda import cuda_autograd, packed, validate
from kda.activation import activated, checked_activation
from kda.chunking import CHUNK_SIZE
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.reference.common import repeat_to_value_heads


# CUDA, use_qk_l2norm_in_kernel on level 5's path: chunk_intra divides each row of q and k by its L2 norm as it
# loads them (compiled with qk_l2norm) instead of torch making normalized copies first, through float32 (issue
# 41's table: 3.72 ms with the option against 1.52 without at (1, 8192, 96, 128)). GDN then takes level 5's path
# too, whose chunk_intra normalizes (the scalar-gate path's kernels do not yet), unless L2NORM_KERNEL is on. On
# since its GPU tests passed (run 103): KDA at (1, 8192, 96, 128), 1.706 ms plain, 3.913 with the option by torch,
# 1.779 with it here (+4%).
L2NORM_IN_KERNEL = True

# CUDA, chunk_kda as a model calls it (fla's use_gate_in_kernel, use_beta_sigmoid_in_kernel) and not
# differentiated: chunk_intra activates the raw gate (softplus or bounded sigmoid form) and beta (sigmoid) as it
# loads them (gate_act, beta_act), instead of torch making activated float32 copies first (a [B, T, H, K] pass for
# the gate). A gate per head (GDN) and allow_neg_eigval keep torch's activations. On since its GPU tests passed
# (run 103): the layer's call at (1, 8192, 96, 128) took 13.88 ms with torch's activations and norms, 8.29 with
# this, L2NORM_IN_KERNEL and PAIRWISE_BY_PRODUCTS on together.
ACTIVATIONS_IN_KERNEL = True

# CUDA: with check_values, the keys against the delta rule's bound (beta ||k||^2 <= 2, kda.validate.check_key_norms)
# in chunk_intra's value checks (check_keys: the sums of squares of the key tile as it is loaded, flags[2]), for
# raw keys (not use_qk_l2norm_in_kernel), so that keys that would diverge are an error on CUDA too, as on the CPU,
# with no pass of their own; GDN's scalar-gate path in its chunk_gated_inverse, from the diagonal of the K K^T it
# makes anyway. Its GPU tests passed in run 108 (H100: KDA, GDN by both paths, dense and packed, grouped value
# heads). Run 111 (H100) timed its cost to chunk_kda's plain call: 1.738 ms against 1.704 at (1, 8192, 96, 128), 2.310
# against 2.262 at (1, 32768, 32, 128), 2.155 against 2.136 at (4, 4096, 64, 128), 1 to 2 %: on.
KEY_CHECK_IN_KERNEL = True


# CUDA, use_qk_l2norm_in_kernel where the kernels do not normalize as they load (GDN's scalar-gate path; every path
# without L2NORM_IN_KERNEL): one launch of kda/kernels/norms.py per tensor, read once and written once in the
# inputs' dtype, instead of torch's copies through float32. With it GDN keeps its scalar-gate path under the fused
# norm too. On since its GPU tests passed (run 103): GDN at (1, 8192, 96, 128), 1.065 ms plain, 3.264 with the
# norm by torch, 1.469 with it in level 5's chunk_intra, 1.265 with this kernel.
L2NORM_KERNEL = True


def l2_normalized(x):
    """``x``'s rows divided by their L2 norm (``sqrt(sum x^2 + 1e-6)``), in ``x``'s dtype: by the kernel of
    ``kda.kernels.norms`` on CUDA with ``L2NORM_KERNEL``, else by torch through float32."""
    if not (L2NORM_KERNEL and x.is_cuda):
        return ref4.l2_normalize(x.float()).to(x.dtype)
    from kda.kernels.norms import normalized_rows

    return normalized_rows(x)


def kernel_inputs(q, k, g, use_qk_l2norm_in_kernel):
    """CUDA: ``q, k`` normalized if asked (``l2_normalized``), and the gate as ``[B, T, H, K]`` per key channel
    or ``[B, T, H, 1]`` per head (``chunk_intra``'s scalar path: no broadcast copy)."""
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalized(q), l2_normalized(k)
    if g.dim() == 3:
        g = g[..., None]
    return q, k, g.contiguous()


def _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
             cu_seqlens, per_channel: bool, check_values: bool, cu_seqlens_cpu=None, options=None):
    compiling = torch.compiler.is_compiling()
    weights = {name: options[name] for name in ("A_log", "dt_bias")} if options else {}
    # compiled or not: the checks below refuse a CUDA input that requires grad unless the op differentiates it
    grads = cuda_autograd.differentiates(q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, **weights)
    activation = None
    if options and (options["use_gate_in_kernel"] or options["use_beta_sigmoid_in_kernel"]
                    or options["allow_neg_eigval"] or options["A_log"] is not None or options["dt_bias"] is not None
                    or options["lower_bound"] is not None):
        if (ACTIVATIONS_IN_KERNEL and per_channel and not (compiling or grads) and validate.runs_kernels(q)
                and not options["allow_neg_eigval"]):           # chunk_intra activates them (gate_act, beta_act)
            # the raw values' checks in the kernel's flags (no read-back here): an activated gate or a raw beta
            # that is not finite
            activation = checked_activation(q, k, v, g, beta, per_channel, options, False)
        else:
            g, beta = activated(q, k, v, g, beta, per_channel, options, check_values and not compiling, grads)
    if compiling or grads:
        # the checks a graph can hold, then the op: its registered backward is kda.backward on CUDA
        scale, h0, _ = validate.check_gated_delta_inputs(
            q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel,
            check_values=check_values and not compiling, cu_seqlens_cpu=cu_seqlens_cpu, read_bounds=not compiling,
            differentiable=grads)
        o, final = torch.ops.kda.chunk_gated_delta(q, k, v, g, beta, scale, h0, output_final_state,
                                                    use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu)
        return o, (final if output_final_state else None)
    return forward_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                         cu_seqlens, per_channel, check_values, cu_seqlens_cpu, activation)


def forward_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                  cu_seqlens, per_channel: bool, check_values: bool, cu_seqlens_cpu=None, activation=None):
    """``chunk_kda`` / ``chunk_gated_delta_rule`` outside ``torch.compile`` (and inside the op
    ``kda::chunk_gated_delta`` that a compiled graph calls). ``activation`` (CUDA, ``ACTIVATIONS_IN_KERNEL``): the
    ``kda.activation.Activation`` that ``chunk_intra`` applies to the raw ``g`` and ``beta`` given."""
    cuda = validate.runs_kernels(q)
    capturing = cuda and torch.cuda.is_current_stream_capturing()    # a CUDA graph: nothing read back
    if capturing and cu_seqlens is not None and not DEVICE_CHUNK_TABLES:
        raise ValueError("packed sequences (cu_seqlens) cannot be captured in a CUDA graph with "
                         "kda.gated_delta.DEVICE_CHUNK_TABLES off: their chunk table is then built on the host; turn "
                         "it on, or capture a batch of equal lengths, or decode steps")
    check_values = check_values and not capturing
    scale, h0, bounds = validate.check_gated_delta_inputs(
        q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel, check_values=check_values and not cuda,
        cu_seqlens_cpu=cu_seqlens_cpu, keys_normalized=use_qk_l2norm_in_kernel,
        read_bounds=not capturing)
    if cuda and SPLIT_IN_OP and bounds is None and activation is None and not capturing:
        from kda import distributed

        split = distributed.op_split(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                                     check_values)
        if split is not None:
            return split
    if cuda:                                             # packed sequences: one launch per stage too
        flags = first_kernel_flags(check_values, use_qk_l2norm_in_kernel, q.device)
        k_given = k
        g_given = g
        fused = use_qk_l2norm_in_kernel and L2NORM_IN_KERNEL     # the norm in the kernels where they can
        q, k, g = kernel_inputs(q, k, g, use_qk_l2norm_in_kernel and not fused)
        table = None
        if bounds is not None:
            table = packed.chunk_table(bounds, q.device)
        elif cu_seqlens is not None:                     # captured: the table made on the device, nothing read back
            table = packed.device_chunk_table(cu_seqlens, q.shape[1])
        check = (lambda flags: validate.raise_flagged_inputs(flags, g_given, beta, k_given)) if check_values else None
        if check_values and activation is not None:      # the full check's errors on the activated values
            check = lambda flags: validate.raise_flagged_inputs(
                flags, *activation.apply(g_given, beta, torch.float32), k_given) if any(flags.tolist()) else None
        o, final = _run_kernels(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, qk_l2norm=fused,
                                activation=activation)
        return o.to(v.dtype), (final.float() if output_final_state else None)
    if use_qk_l2norm_in_kernel:
        q, k = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    q = q.double() * scale
    q, k = repeat_to_value_heads(q, k, v.shape[2])
    run = lambda q, k, v, g, beta, h0: ref0.chunked(q, k, v, g, beta, CHUNK_SIZE, h0, True)
    if bounds is None:
        o, final = run(q, k, v, g, beta, h0)
    else:                                                # packed sequences, one after another
        pieces, finals = [], []
        for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
            state = h0[n:n + 1] if h0 is not None else None
            if e == s:                                   # an empty sequence keeps its state
                pieces.append(v[:, s:e])
                finals.append(state[0] if state is not None else v.new_zeros(v.shape[2], k.shape[-1], v.shape[-1]))
                continue
            o_n, f_n = run(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], state)
            pieces.append(o_n.to(v.dtype))
            finals.append(f_n[0])
        o, final = torch.cat(pieces, dim=1), torch.stack([f.float() for f in finals])
    return o.to(v.dtype), (final.float() if output_final_state else None)


# CUDA (dense, not differentiated, not in a CUDA graph, activations not in the kernels): the op through the intra-card
# split with warm-up starts (kda.distributed.op_split, WARMUP_STARTS on too) where its rule splits: GDN by the
# scalar-gate pass where the op's own blocks would leave SMs idle (32 heads at batch 1), KDA and GDN at long context
# with few heads. Run 108 (H100, before the window was checked on the device): GDN at (1, 32768, 32, 128) 1.63 ms split
# against 1.80 for the op. Run 111 (H100, its GPU tests passed): at (1, 131072, 4, 128) the op 2.27 ms routed against
# 2.60 (GDN) and 2.55 against 2.87 (KDA), though the split alone took 1.23 (GDN) and 1.62 (KDA): the op's value checks
# read back (the keys' norms through a float64 copy) cost about 1 ms there. Off until the route's other shapes are timed
# with the cheaper key check (choose_pieces also splits (1, 32768, 32) GDN and (1, 32768, 4) KDA and GDN, where run 108
# had the split slower). Run 112: at (1, 32768, 32) GDN the split took 1.44 ms against 1.75 unsplit, the routed op
# 1.80 (its checks read back first, 0.35 ms); at (1, 32768, 4) every split lost. Runs 114 to 117 (H100): the split's
# extra time was the host's (it waited for both passes before returning); with the value flags and the window's check
# read back behind the first kernel alone, its GPU tests passed (runs 116 and 118) and the op routed took 0.798 ms
# against 2.590 at (1, 131072, 4) GDN, 0.958 against 1.750 at (1, 32768, 32) GDN (run 118), 1.22 against 2.86 at
# (1, 131072, 4) KDA (run 117; FlashQLA's automatic split 0.456 and 0.745 there): on, for the long calls
# op_split's rule names. Run 151 found GDN's split host-bound again (0.636 ms of host a call at (1, 131072, 4), its
# kernels 0.45); without the host-side copies of the windows, starts and G (run 152, H100, GPU tests passed) it took
# 0.412 ms there, 0.752 at (1, 32768, 32) and 0.676 grouped (16 / 32 heads), FlashQLA 0.457, 0.748 and 0.690.
SPLIT_IN_OP = True

# CUDA: a packed call captured in a CUDA graph (cu_seqlens; a host copy is not read there) builds its chunk table on the
# device (kda.packed.device_chunk_table: sized by bounds the shapes give, nothing read back), so that the graph
# replays with other boundaries of the same T and N. Its GPU test passed in run 111 (H100: KDA and GDN, replayed
# with new boundaries against eager calls): on.
DEVICE_CHUNK_TABLES = True


def first_kernel_flags(check_values: bool, use_qk_l2norm_in_kernel: bool, device) -> torch.Tensor:
    """The first kernel's value flags, zeroed: the gate, ``beta``, and the raw keys (a third flag) where
    ``check_values`` and ``KEY_CHECK_IN_KERNEL`` ask for them and the call does not normalize the keys."""
    keys = check_values and KEY_CHECK_IN_KERNEL and not use_qk_l2norm_in_kernel
    return torch.zeros(3 if keys else 2, dtype=torch.int32, device=device)


# --8<-- [start:run_kernels]
def _run_kernels(q, k, v, g, beta, scale, h0, flags=None, table=None, output_final_state=True, check=None,
                 qk_l2norm=False, activation=None):
    """One batch ``[B, T, H, *]`` (or the packed sequences of ``table``) through the level-5
    pipeline, or a scalar gate through ``kda.kernels.scalar_gate`` where its switch and its block rule
    send it (``SCALAR_GATE_PATH``, ``scalar_gate_columns``; see below); returns ``o``
    and the float32 final states (``None`` without ``output_final_state``). ``check(flags)`` runs once
    the state pass is queued (``validate.launch_then_check``): the host waits for the first kernel's
    flags only, and the pass runs while the caller's next work does. ``qk_l2norm``: ``q`` and ``k`` come raw and
    are L2-normalized by ``chunk_intra``, on level 5's path (taken then for a gate per head too: the scalar-gate
    path's kernels do not normalize). ``activation``: ``g`` and ``beta`` come raw and ``chunk_intra`` activates them
    (a gate per channel)."""
    # with the norm fused, level 5's path (its chunk_intra normalizes) over the scalar-gate path and torch's norm
    # (1.22 ms against 0.87 + about 2.2 at (1, 8192, 96, 128): the GDN record, issue 41's table); with the norm's
    # own kernel (L2NORM_KERNEL) the scalar-gate path and that kernel
    if SCALAR_GATE_PATH and g.shape[-1] == 1 and (table is None or SCALAR_GATE_PACKED) and not (
            qk_l2norm and not L2NORM_KERNEL):
        from kda.kernels.build import sm_count

        from kda.kernels import scalar_gate

        if scalar_gate.takes_packed_tiles(table, h0, output_final_state, v.shape[-1]):
            if qk_l2norm:                                # its kernel reads q and k as they are
                q, k = l2_normalized(q), l2_normalized(k)
            checks, start, o = scalar_gate.packed_tile_launch(q, k, v, g, beta, scale, flags, table,
                                                              scalar_gate.TILE_CHECKS_FIRST and check is not None)
            if checks is not None and scalar_gate.TILE_CHECKS_BESIDE:   # ... on a stream of their own
                validate.check_beside(flags, checks, start, check)
            elif checks is not None:                     # the host waits for the checks' kernel alone
                checks()
                validate.launch_then_check(flags, start, check)
            else:                                        # its one kernel sets the flags: read them after it
                start()
                validate.launch_then_check(flags, lambda: None, check)
            return o, None
        _, lanes, _ = packed.sequence_tables(table, q.shape[0], q.device)
        block_dv = scalar_gate_columns(lanes, v.shape[2], v.shape[-1], sm_count(q.device))
        if block_dv is not None:
            if qk_l2norm:                                # its kernels read q and k as they are
                q, k = l2_normalized(q), l2_normalized(k)
            return _run_scalar_gate(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, block_dv)
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.kernels.gated_state_pass import state_pass_launch

    starts, stream = None, takes_stream(table, h0, output_final_state)
    if stream:
        table, starts = packed.stream_table(table.bounds, q.device)
    elif takes_sequence_tiles(table, h0, output_final_state):
        table, starts = packed.sequence_tile_table(table.bounds, q.device)
    form = prepare_chunks(q, k, v, g, beta, scale, flags, table, qk_l2norm=qk_l2norm, activation=activation,
                          starts=starts, stream=stream)
    start, o, ht = state_pass_launch(form, h0, table, output_final_state)
    validate.launch_then_check(flags, start, check)
    return o, ht
# --8<-- [end:run_kernels]


# Level 5's path over packed sequences of at most one chunk each with no initial and no final states (the host knows
# the boundaries): tiles of whole sequences (kda.packed.sequence_tile_table) as the chunks, chunk_intra compiled with
# tile_sequences keeping the pairs of one sequence, the pass from zero states over the tiles. Run 155's 1024 sequences
# of 1 to 64 tokens become 696 chunks instead of 1024 (526 as one sequence), its 8192 of 1 to 8 tokens 598 instead of
# 8192 (GDN's packed_tile_output took the latter from 10.03 to 1.26 ms). Run 157 (H100): its GPU test
# (test_sequence_tiles_per_channel in tests/test_gpu_level5.py) passed 16 of 18: GDN on level 5's kernels and fp16 KDA
# every gate, bf16 KDA runs of -20; bf16 KDA with logsigmoid and kda_style gates each had one sequence at 5.1e-3
# against the bound of 5e-3 (the other sequences within it). Off until the untiled path's error on those sequences is
# known (the bound or the tiles) and it is timed (results/tuning/run158-kda-tiles.py).
TILES_OF_SHORT_SEQUENCES = False


def takes_sequence_tiles(table, h0, output_final_state: bool) -> bool:
    """Whether level 5's path runs ``table``'s packed sequences in tiles (``TILES_OF_SHORT_SEQUENCES``): the host
    knows their boundaries and that none has more than one chunk, and no state comes in or goes out."""
    return TILES_OF_SHORT_SEQUENCES and packed.stateless_known(table, h0, output_final_state, most_chunks=1)



# Level 5's path over packed sequences with no initial and no final states (the host knows the boundaries) as one
# stream of chunks: the packed tokens cut into chunks as one sequence would be (packed.stream_table), chunk_intra
# compiled with stream masking the pairs of two sequences and writing Qw and W only on the rows that continue a
# sequence, Kw only on the chunk's last sequence and a zero decay where it began (kda.reference.packed_stream, equal
# to the recurrence in float64), then the pass over the one stream, unchanged. Every chunk is a chunk of work: 526
# for run 140's 1024 sequences of 1 to 64 tokens (1024 through the chunk table, 696 as tiles), any lengths. Prepared
# on the CPU (2026-12-07), off until its GPU test and timing; it takes the place of TILES_OF_SHORT_SEQUENCES where
# both are on.
STREAM_OF_CHUNKS = False


def takes_stream(table, h0, output_final_state: bool) -> bool:
    """Whether level 5's path runs ``table``'s packed sequences as one stream of chunks (``STREAM_OF_CHUNKS``): the
    host knows their boundaries and no state comes in or goes out."""
    return STREAM_OF_CHUNKS and packed.stateless_known(table, h0, output_final_state)


# The scalar-gate path (``kda.kernels.scalar_gate``), on for GDN where its blocks fill enough SMs. Run 90
# (H200, bf16, ms; results/tuning/run90/) against level 5's path: 0.871 / 1.215 at (1, 8192, 96, 128),
# 0.985 / 1.477 at (4, 4096, 64, 128), 1.478 / 1.696 at (1, 16384, 64, 128), 0.870 / 1.211 at
# (2, 8192, 48, 128); but 2.503 / 1.680 at (1, 32768, 32, 128), where 32 blocks leave most SMs idle.
# Run 89 had it slower everywhere: its first kernel then took 0.74 ms, 0.35 now (chunk_gated_inverse's
# defaults).
SCALAR_GATE_PATH = True

# It takes one value block of this many columns per (head, sequence) and runs where those blocks fill
# at least SCALAR_GATE_MIN_BLOCKS of the SMs (0.4 of 132: 64 heads take it, 32 do not): with fewer, its
# pass repeats Q K^T and K S per value block or leaves SMs idle (run 89: 2.60 ms at 64 columns and 3.04
# at 128 for 32 heads).
SCALAR_GATE_COLUMNS = 128
SCALAR_GATE_MIN_BLOCKS = 0.4       # blocks per SM
# Packed sequences take it too (one launch per kernel, groups of sequences per block; GPU tests passed in runs 89
# and 90). Run 112 (H100, 32 heads of 128, bf16): 32768 tokens in 96 random lengths 1.143 ms against 1.707 by level
# 5's path (FlashQLA 1.208), 1024 sequences of 1 to 64 tokens 1.952 against 2.717 (FlashQLA 5.997): on.
SCALAR_GATE_PACKED = True


def scalar_gate_columns(B: int, H: int, DV: int, sm_count: int) -> int | None:
    """Value columns per block of the scalar-gate pass for ``B`` sequences (or groups of packed
    sequences, ``seq_groups``) of ``H`` value heads, or ``None`` where its blocks would fill less than
    ``SCALAR_GATE_MIN_BLOCKS`` of the SMs (level 5's path then)."""
    columns = min(SCALAR_GATE_COLUMNS, DV)
    return columns if B * H * (DV // columns) >= SCALAR_GATE_MIN_BLOCKS * sm_count else None


def _run_scalar_gate(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, block_dv):
    """GDN through ``kda.kernels.scalar_gate``: ``chunk_gated_inverse`` (``G`` and ``Tb``, checking
    ``g`` and ``beta`` as it reads them), then ``inverse_state_output_pass``. With the ``table`` of
    packed sequences, each kernel is one launch for all of them, as level 5's."""
    from kda.kernels.scalar_gate import scalar_gate_inverse, scalar_gate_pass_launch

    G, Tb = scalar_gate_inverse(k, g, beta, v.shape[2], flags, table)
    start, o, ht = scalar_gate_pass_launch(q, k, v, Tb, G, scale, h0, block_dv, table, output_final_state)
    validate.launch_then_check(flags, start, check)
    return o, ht


# --8<-- [start:chunk_kda]
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, cu_seqlens=None, cu_seqlens_cpu=None,
              A_log=None, dt_bias=None, check_values=True):
    """Kimi Delta Attention, forward. Arguments as in fla 0.6.0's ``chunk_kda``:

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, ``HV = H`` or a multiple of it (grouped value
            heads: value head ``i`` reads query and key head ``i // (HV / H)``); below, ``H`` is ``HV``.
        g: ``[B, T, H, K]``, the per-channel forget gate in log space (``<= 0``, finite).
        beta: ``[B, T, H]``, in ``[0, 1]``.
        scale: multiplies ``q``; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` for ``N`` sequences (``N = B`` without ``cu_seqlens``).
        output_final_state: also return the float32 final states ``[N, H, K, V]``.
        use_qk_l2norm_in_kernel: L2-normalize ``q`` and ``k`` over the head dimension first.
        use_gate_in_kernel: ``g`` is the raw gate, turned into ``-exp(A_log) softplus(g + dt_bias)``
            (``A_log [H]``, ``dt_bias [H * K]``), or with ``safe_gate`` and ``lower_bound`` into
            ``lower_bound sigmoid(exp(A_log) (g + dt_bias))``. Computed in torch before the kernels
            (not fused yet; the decode kernel does fuse it).
        use_beta_sigmoid_in_kernel: ``beta`` is logits, turned into ``sigmoid(beta)``.
        allow_neg_eigval: not supported by the chunked forward (raises).
        cu_seqlens: ``[N + 1]`` boundaries of the sequences packed along ``T`` (then ``B = 1``).
        check_values: raise if a gate is not finite and ``<= 0`` or a ``beta`` is outside ``[0, 1]``
            (not in fla's API). On CUDA the first kernel checks them as it reads them, and the host
            reads its two flags once the state pass is queued: a wait for the first kernel, after
            which the pass runs while the caller goes on. ``False`` skips the read-back (a bad
            value then gives a wrong result, not an error). On the CPU, without
            ``use_qk_l2norm_in_kernel``, also raise if ``beta ||k||^2 > 2`` somewhere (the delta rule's
            update leaves ``[-1, 1]`` and the state diverges; ``validate.check_key_norms``); on CUDA the
            first kernel checks the keys too, with ``KEY_CHECK_IN_KERNEL`` (on).
        cu_seqlens_cpu: a host copy of ``cu_seqlens`` (as in fla); given, the boundaries are not
            read back from the GPU. It must equal ``cu_seqlens``; that is not checked.

    Returns:
        ``(o, final_state)``: ``o [B, T, H, V]`` in the dtype of ``v``; ``final_state`` or ``None``.
    """
    if allow_neg_eigval:
        raise ValueError("allow_neg_eigval is not supported by the chunked forward yet (its kernels check beta "
                         "in [0, 1]); fused_recurrent_kda supports it")
    if safe_gate != (lower_bound is not None):
        raise ValueError("safe_gate and lower_bound go together (as in fla): the gate lower_bound sigmoid(...)")
    options = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=False,
                   lower_bound=lower_bound, state_v_first=False)
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens, per_channel=True, check_values=check_values, cu_seqlens_cpu=cu_seqlens_cpu,
                    options=options)
# --8<-- [end:chunk_kda]


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, check_values=True,
                           cu_seqlens_cpu=None):
    """Gated DeltaNet (GDN), forward: ``chunk_kda`` with one gate per head, ``g [B, T, H]``.
    Arguments and results as in fla 0.6.0's ``chunk_gated_delta_rule``, plus ``check_values``
    (see ``chunk_kda``)."""
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens, per_channel=False, check_values=check_values, cu_seqlens_cpu=cu_seqlens_cpu)
