"""Level 5 public functions, shaped like fla 0.6.0's: ``chunk_kda`` (per-channel gate, KDA) and
``chunk_gated_delta_rule`` (scalar gate, GDN), with variable-length batches through ``cu_seqlens``.

The recurrence (fla's convention, state ``d_k x d_v``)::

    S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T (scale q_t)

On CUDA the kernels of ``kda.kernels.chunk_intra`` and ``kda.kernels.gated_state_pass`` (a scalar gate takes ``chunk_intra``'s scalar path:
one GEMM for the scores, the decay applied after it), in two steps that ``kda.distributed`` reuses:
``prepare_chunks`` (``chunk_intra``, every chunk at once) and ``run_state_pass`` (sequential); on
the CPU the float64 chunked reference of ``kda.reference.level0``. Packed sequences (``cu_seqlens``)
go through each kernel in one launch (``chunk_table``), and through the CPU reference one after
another. ``v``, ``g``, ``beta`` and the states may have more heads than ``q`` and ``k`` (grouped
value heads, as in fla): ``HV`` a multiple of ``H``, value head ``i`` reading query and key
head ``i // (HV / H)``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from kda import cuda_autograd, ops, validate
from kda.activation import activated, checked_activation
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4



def check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel: bool, check_values=True,
                 cu_seqlens_cpu=None, read_bounds=True, differentiable=False, keys_normalized=True):
    """Every argument checked (clear errors, nothing computed); returns ``scale`` as a float, the
    initial state or ``None``, and the ``cu_seqlens`` boundaries or ``None``. With
    ``check_values=False`` the values of ``g`` and ``beta`` are left to
    ``validate.raise_flagged_values`` after the first kernel (``chunk_intra`` checks them as it
    reads them). ``read_bounds=False`` (under ``torch.compile``) leaves the boundaries on the
    device: the op reads them. ``differentiable``: a CUDA call that ``kda.backward`` differentiates
    (through the op), whose inputs may require grad."""
    with cuda_autograd.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v, grouped_values=True)   # H: the value heads
        if validate.check_gates(g, B, T, H, DK, q.device, check_values=False) != per_channel:
            form = "[B, T, H, DK] (one gate per key channel)" if per_channel else "[B, T, H] (one gate per head)"
            raise ValueError(f"g must have shape {form} here, got {validate.shape_of(g)}")
        validate.check_beta(beta, B, T, H, q.device, check_values=False)
        if check_values:                                  # both ranges in one read-back
            gate_range, beta_range = validate.value_ranges(g, beta)
            validate.check_gate_range(g, *gate_range)
            validate.check_beta_range(*beta_range)
        scale = validate.check_scale(scale, DK)
        bounds = validate.check_cu_seqlens(cu_seqlens, B, T, cu_seqlens_cpu, read_values=read_bounds)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        h0 = validate.check_initial_state(initial_state, N, H, DK, DV, q.device)
        if check_values and not keys_normalized:          # after every shape: the keys against the delta rule's bound
            validate.check_key_norms(k, beta)
    return scale, h0, bounds


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

# CUDA: chunk_intra's steep chunks (a gate that falls by more than 2^96 inside a 16-row sub-chunk: most chunks of a
# layer's gates, -exp(A_log) softplus(.) with A_log up to log 16) summed by running products of the token decays
# (pairwise="products": one exponential per token and channel, sixteen accumulators per thread) instead of an
# exponential and four shared loads per pair and channel; exact for any gate as before. Issue 41 priced the
# steep path at 10.28 ms against 0.656 for mild gates (level 3's record). Its GPU tests passed (run 103), and it
# stays off: at (1, 8192, 96, 128) steep gates (a layer's) take 6.58 ms with it against 9.77, but mild ones
# (logsigmoid) 1.885 against 1.511, the plain call 25% slower.
PAIRWISE_BY_PRODUCTS = False

# CUDA: chunk_intra's steep chunks with their 16 x 16 diagonal blocks by halvings (pairwise="halvings"): for blocks of
# 8, 4, 2 and 1 rows' halves, the pairs across a block's two halves factor through the upper half's last row, both
# factors <= 1, one GEMM of the stacked [q; k] per halving and one for A_qk's diagonal, one exponential per element
# and halving, no shared memory of its own (108.5 KB as the default, two blocks per SM; PAIRWISE_BY_PRODUCTS needs
# 124 KB). Exact for any gate, as the pairwise sums. Takes the place of PAIRWISE_BY_PRODUCTS where both are on.
# Not yet run on a GPU.
PAIRWISE_BY_HALVINGS = False


# CUDA: with check_values, the keys against the delta rule's bound (beta ||k||^2 <= 2, kda.validate.check_key_norms)
# in chunk_intra's value checks (check_keys: the sums of squares of the key tile as it is loaded, flags[2]), for
# raw keys (not use_qk_l2norm_in_kernel), so that keys that would diverge are an error on CUDA too, as on the CPU,
# with no pass of their own; GDN's scalar-gate path in its chunk_gated_inverse, from the diagonal of the K K^T it
# makes anyway. Not yet run on a GPU.
KEY_CHECK_IN_KERNEL = False


def raise_flagged_inputs(flags, g, beta, k) -> None:
    """``validate.raise_flagged_values`` for the gate and ``beta`` (``flags[0]``, ``flags[1]``), then the keys
    (``flags[2]``, where the first kernel checked them: ``check_keys``): the host check's error, with the worst
    key and where (``validate.check_key_norms``; ``beta`` activated)."""
    host = flags.cpu()                                          # one read-back for every flag
    validate.raise_flagged_values(host[:2], g, beta)
    if len(host) > 2 and host[2]:
        validate.check_key_norms(k, beta)                       # raises with the worst key found
        raise ValueError("k: the kernel found beta * ||k||^2 > 2, past the delta rule's bound; normalize the keys "
                         "(use_qk_l2norm_in_kernel=True)")


def keys_checked(flags) -> dict:
    """The first kernel's compile flag for the keys' check: on where the caller hands it three value flags."""
    return {"check_keys": True} if flags is not None and flags.numel() == 3 else {}


def steep_chunks() -> dict:
    """``chunk_intra``'s compile flag for the diagonal blocks of steep chunks, by the two switches above."""
    if PAIRWISE_BY_HALVINGS:
        return {"pairwise": "halvings"}
    return {"pairwise": "products"} if PAIRWISE_BY_PRODUCTS else {}


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
    from kda.kernels import norms
    from kda.kernels.build import compile_program

    D = x.shape[-1]
    with torch.cuda.device(x.device):
        kernel = compile_program(norms.l2_normalize_rows, (), D=D, dtype=ops.dtype_name(x.dtype))
        out = ops.new_output(x.shape, x.dtype, x.device)
        kernel(x.contiguous().view(-1, D), out.view(-1, D))
    return out


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
        scale, h0, _ = check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel,
                                    check_values=check_values and not compiling, cu_seqlens_cpu=cu_seqlens_cpu,
                                    read_bounds=not compiling, differentiable=grads)
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
    if capturing and cu_seqlens is not None:
        raise ValueError("packed sequences (cu_seqlens) cannot be captured in a CUDA graph yet: their chunk table "
                         "is built on the host; capture a batch of equal lengths, or decode steps")
    check_values = check_values and not capturing
    scale, h0, bounds = check_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel,
                                     check_values=check_values and not cuda, cu_seqlens_cpu=cu_seqlens_cpu,
                                     keys_normalized=use_qk_l2norm_in_kernel)
    if cuda:                                             # packed sequences: one launch per stage too
        keys = check_values and KEY_CHECK_IN_KERNEL and not use_qk_l2norm_in_kernel   # flags[2]: the keys
        flags = torch.zeros(3 if keys else 2, dtype=torch.int32, device=q.device)
        k_given = k
        g_given = g
        fused = use_qk_l2norm_in_kernel and L2NORM_IN_KERNEL     # the norm in the kernels where they can
        q, k, g = kernel_inputs(q, k, g, use_qk_l2norm_in_kernel and not fused)
        table = chunk_table(bounds, q.device) if bounds is not None else None
        check = (lambda flags: raise_flagged_inputs(flags, g_given, beta, k_given)) if check_values else None
        if check_values and activation is not None:      # the full check's errors on the activated values
            check = lambda flags: raise_flagged_inputs(
                flags, *activation.apply(g_given, beta, torch.float32), k_given) if any(flags.tolist()) else None
        o, final = _run_kernels(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, qk_l2norm=fused,
                                activation=activation)
        return o.to(v.dtype), (final.float() if output_final_state else None)
    if use_qk_l2norm_in_kernel:
        q, k = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    q = q.double() * scale
    group = v.shape[2] // q.shape[2]                     # grouped value heads: q, k repeated
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
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


# --8<-- [start:run_kernels]
class ChunkForm(NamedTuple):
    """What the sequential pass reads, for every chunk of a batch ``[B, T, H, *]``."""
    Qw: torch.Tensor         # scale Q 2^G                       [B, T, H, DK]
    Kw: torch.Tensor         # K 2^(G_last - G)                  [B, T, H, DK]
    W: torch.Tensor          # T diag(b) (K 2^G)                 [B, T, H, DK]
    U: torch.Tensor          # T diag(b) V                       [B, T, H, DV]
    A_qk: torch.Tensor       # masked decayed scores, scale in   [B, T, H, C]
    decay: torch.Tensor      # 2^G_last of each chunk, float32   [B, H, NC, DK]


class ChunkTable(NamedTuple):
    """Where the chunks of packed sequences lie (on the device, int32), built once per call."""
    chunks: torch.Tensor         # first token and length of every chunk, sequence by sequence  [NC, 2]
    cu_seqlens: torch.Tensor     # the sequences' boundaries                                     [N + 1]
    chunk_offsets: torch.Tensor  # index of each sequence's first chunk in ``chunks``            [N + 1]
    seq_groups: torch.Tensor     # first sequence of each group the state pass carries in one block [NG + 1]


# The state pass carries, in one block, the packed sequences whose first chunk lies in one window of
# this many chunks: 1024 sequences of 1 to 64 tokens take 32 groups, not 1024 blocks per value stripe.
GROUP_CHUNKS = 32


def seq_groups(chunk_offsets: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The groups of sequences, as the index of each group's first sequence and then ``N``: a new
    group starts where a sequence's first chunk ``chunk_offsets[n]`` falls in another window of
    ``window`` chunks than the sequence before it. A sequence longer than the window ends its group
    (the next sequence starts in a later window); an empty sequence joins the group of its offset."""
    windows = chunk_offsets[:-1] // (window or GROUP_CHUNKS)
    starts = torch.nonzero(windows[1:] != windows[:-1]).flatten() + 1
    N = chunk_offsets.shape[0] - 1
    return torch.cat([starts.new_zeros(1 if N > 0 else 0), starts, starts.new_full((1,), N)])


def chunk_table(bounds, device, chunk_size=CHUNK_SIZE) -> ChunkTable:
    """The chunk table of the packed sequences with boundaries ``bounds`` (a host list, as
    ``validate.check_cu_seqlens`` returns it): a sequence of ``n`` tokens has ``ceil(n / C)`` chunks, the
    last one short; an empty sequence has none. Built on the host and copied to ``device`` once per
    boundaries: every layer of a model sees the same ones (the last few tables are kept)."""
    return _chunk_table(tuple(bounds), torch.device(device), chunk_size)


@functools.lru_cache(maxsize=8)
def _chunk_table(bounds: tuple, device: torch.device, chunk_size: int) -> ChunkTable:
    cu = torch.tensor(bounds, dtype=torch.int64)
    counts = ceildiv(cu[1:] - cu[:-1], chunk_size)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    seq = torch.repeat_interleave(torch.arange(len(counts)), counts)
    first = cu[seq] + (torch.arange(int(offsets[-1])) - offsets[seq]) * chunk_size
    length = torch.minimum(cu[seq + 1] - first, torch.tensor(chunk_size))
    to_device = lambda x: x.to(torch.int32).to(device, non_blocking=True)
    return ChunkTable(to_device(torch.stack([first, length], dim=1)), to_device(cu), to_device(offsets),
                      to_device(seq_groups(offsets)))


def prepare_chunks(q, k, v, g, beta, scale, flags=None, table=None, backward_outputs=False, qk_l2norm=False,
                   activation=None):
    """Stage 1 of the level-5 pipeline (``chunk_intra``), every chunk of the batch at once.
    ``flags`` (int32 ``[2]``, zeroed) collects the kernel's value checks of ``g`` and ``beta``, ``[3]`` those of
    the keys too (``check_keys``; ``raise_flagged_inputs``); ``None`` for callers that checked the values
    before. With the
    ``table`` of packed sequences (``chunk_table``, ``B = 1``) every chunk of every sequence is
    one block of the same launch. ``backward_outputs`` (dense; ``kda.backward``): returns ``(form, G, Tinv,
    KKE)``, the kernel's outputs of that flag (``G [B, H, NC C, GD]`` float32 log2, ``Tinv`` in the inputs'
    dtype, ``KKE`` float32, both ``[B, T, H, C]``). ``qk_l2norm``: the kernel L2-normalizes the rows of ``q`` and
    ``k`` as it loads them (``L2NORM_IN_KERNEL``). ``activation`` (``ACTIVATIONS_IN_KERNEL``): ``g`` and ``beta``
    are raw and the kernel applies that ``kda.activation.Activation`` to them."""
    from kda.kernels.build import compile_program
    from kda.kernels.chunk_intra import chunk_intra

    B, T, _, DK = q.shape
    H, DV, C = v.shape[2], v.shape[-1], CHUNK_SIZE       # H: value heads (q, k may have fewer)
    NC = ceildiv(T, C) if table is None else table.chunks.shape[0]
    dtype, gate_dtype = ops.dtype_name(q.dtype), str(g.dtype).removeprefix("torch.")
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.to(torch.float32).contiguous()
    with torch.cuda.device(q.device):
        extra = {name: True for name, on in (("backward_outputs", backward_outputs), ("qk_l2norm", qk_l2norm)) if on}
        extra.update(steep_chunks() if g.shape[-1] > 1 else {})
        extra.update(keys_checked(flags))
        acts = []                                        # A_log, dt_bias, lower_bound after the chunk table
        if activation is not None:
            extra.update(gate_act=activation.gate, beta_act=activation.beta)
            GD = g.shape[-1]
            A_log = activation.A_log if activation.A_log is not None else torch.zeros(H, device=q.device)
            dt_bias = activation.dt_bias if activation.dt_bias is not None else torch.zeros(H, GD, device=q.device)
            acts = [A_log.float().contiguous(), dt_bias.float().reshape(H, GD).contiguous(),
                    float(activation.lower_bound)]
        intra = compile_program(chunk_intra, (), DK=DK, DV=DV, chunk_size=C, dtype=dtype,
                                gate_dtype=gate_dtype, varlen=table is not None, value_groups=H // q.shape[2],
                                scalar_gate=g.shape[-1] == 1, **extra)
        new = lambda shape, dt=q.dtype: ops.new_output(shape, dt, q.device)
        Qw, Kw, W = new((B, T, H, DK)), new((B, T, H, DK)), new((B, T, H, DK))
        decay, A_qk, U = new((B, H, NC, DK), torch.float32), new((B, T, H, C)), new(v.shape)
        if flags is None:
            flags = torch.zeros(2, dtype=torch.int32, device=q.device)
        chunks = table.chunks if table is not None else ops.stand_in(2, torch.int32, q.device)
        if backward_outputs:
            G, KKE = new((B, H, NC * C, g.shape[-1]), torch.float32), new((B, T, H, C), torch.float32)
            Tinv = new((B, T, H, C))
            intra(q, k, v, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, chunks, G, Tinv, KKE)
            return ChunkForm(Qw, Kw, W, U, A_qk, decay), G, Tinv, KKE
        intra(q, k, v, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, chunks, *acts)
    return ChunkForm(Qw, Kw, W, U, A_qk, decay)


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
    launch, o, ht = state_pass_launch(form, h0, table, output_final_state)
    launch()
    return o, ht


def sequence_tables(table, B: int, device):
    """What a sequential pass takes for the packed sequences of ``table`` (``None``: a dense batch of
    ``B`` sequences): ``(states, lanes, tables)`` with ``states`` the sequences, ``lanes`` the blocks per
    head and value block (groups of packed sequences, ``seq_groups``) and ``tables`` the pass's last
    three arguments (``cu_seqlens, chunk_offsets, seq_groups``, or ``[1]`` stand-ins)."""
    if table is None:
        return B, B, [ops.stand_in(1, torch.int32, device)] * 3
    return (table.cu_seqlens.shape[0] - 1, table.seq_groups.shape[0] - 1,
            [table.cu_seqlens, table.chunk_offsets, table.seq_groups])


def queued(kernel, args, device):
    """``kernel(*args)`` on ``device`` as a function to call later (``validate.launch_then_check``)."""
    def launch():
        with torch.cuda.device(device):
            kernel(*args)

    return launch


def state_pass_launch(form: ChunkForm, h0, table=None, output_final_state=True):
    """``run_state_pass`` up to its launch: the compiled pass with its arguments and outputs ready,
    as ``(launch, o, final state or None)``; nothing runs until ``launch()``."""
    from kda.kernels.build import compile_program, sm_count
    from kda.kernels.gated_state_pass import gated_state_output_pass

    B, T, H, DK = form.Qw.shape
    DV = form.U.shape[-1]
    device = form.Qw.device
    N, lanes, tables = sequence_tables(table, B, device)
    with torch.cuda.device(device):
        state_pass = compile_program(gated_state_output_pass, (), DK=DK, DV=DV, chunk_size=CHUNK_SIZE,
                                     block_dv=state_pass_columns(lanes, H, DV, sm_count(device)),
                                     dtype=ops.dtype_name(form.Qw.dtype), varlen=table is not None,
                                     initial_state=h0 is not None, final_state=output_final_state)
        h0, ht = ops.state_arguments(h0, output_final_state, N, H, DK, DV, device)
        o = ops.new_output((B, T, H, DV), form.U.dtype, device)
    return queued(state_pass, (*form, h0, o, ht, *tables), device), o, (ht if output_final_state else None)


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

        _, lanes, _ = sequence_tables(table, q.shape[0], q.device)
        block_dv = scalar_gate_columns(lanes, v.shape[2], v.shape[-1], sm_count(q.device))
        if block_dv is not None:
            if qk_l2norm:                                # its kernels read q and k as they are
                q, k = l2_normalized(q), l2_normalized(k)
            return _run_scalar_gate(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, block_dv)
    form = prepare_chunks(q, k, v, g, beta, scale, flags, table, qk_l2norm=qk_l2norm, activation=activation)
    launch, o, ht = state_pass_launch(form, h0, table, output_final_state)
    validate.launch_then_check(flags, launch, check)
    return o, ht
# --8<-- [end:run_kernels]


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
# chunk_gated_inverse's arrangement beyond its defaults (chunks per block, stages, blocks per SM):
# run 90 timed ten (results/tuning/run90-gdn-inverse.py); the defaults are its best.
SCALAR_GATE_INVERSE_CONFIG: dict = {}
# Packed sequences can take it too (one launch per kernel, groups of sequences per block); not by
# default until a timing says where it pays.
SCALAR_GATE_PACKED = False


def scalar_gate_columns(B: int, H: int, DV: int, sm_count: int) -> int | None:
    """Value columns per block of the scalar-gate pass for ``B`` sequences (or groups of packed
    sequences, ``seq_groups``) of ``H`` value heads, or ``None`` where its blocks would fill less than
    ``SCALAR_GATE_MIN_BLOCKS`` of the SMs (level 5's path then)."""
    columns = min(SCALAR_GATE_COLUMNS, DV)
    return columns if B * H * (DV // columns) >= SCALAR_GATE_MIN_BLOCKS * sm_count else None


def scalar_gate_inverse(k, g, beta, H, flags=None, table=None):
    """``chunk_gated_inverse`` over every chunk (of the packed sequences of ``table``): ``(G [B, H, NC C],
    Tb [B, T, H, C])``, ``g [B, T, H(, 1)]``, ``H`` the value heads; ``flags`` (int32 ``[2]``, zeroed)
    collects its value checks of ``g`` and ``beta``, ``[3]`` those of the keys too (``check_keys``)."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    B, T, HQ, DK = k.shape
    C = CHUNK_SIZE
    NC = ceildiv(T, C) if table is None else table.chunks.shape[0]
    with torch.cuda.device(k.device):
        inverse = compile_program(scalar_gate.chunk_gated_inverse, (), DK=DK, chunk_size=C,
                                  dtype=ops.dtype_name(k.dtype), gate_dtype=str(g.dtype).removeprefix("torch."),
                                  value_groups=H // HQ, varlen=table is not None, **SCALAR_GATE_INVERSE_CONFIG,
                                  **keys_checked(flags))
        G = ops.new_output((B, H, NC * C), torch.float32, k.device)
        Tb = ops.new_output((B, T, H, C), k.dtype, k.device)
        if flags is None:
            flags = torch.zeros(2, dtype=torch.int32, device=k.device)
        chunks = table.chunks if table is not None else ops.stand_in(2, torch.int32, k.device)
        inverse(k.contiguous(), g.reshape(B, T, H).contiguous(), beta.to(torch.float32).contiguous(), G, Tb, flags,
                chunks)
    return G, Tb


def scalar_gate_pass_launch(q, k, v, Tb, G, scale, h0, block_dv, table=None, output_final_state=True):
    """``inverse_state_output_pass`` up to its launch, as ``(launch, o, final state or None)``
    (``state_pass_launch``'s form); one state per sequence (``[N, H, DK, DV]`` with ``table``)."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    B, T, HQ, DK = q.shape
    H, DV = v.shape[2], v.shape[-1]
    device = q.device
    N, _, tables = sequence_tables(table, B, device)
    with torch.cuda.device(device):
        state_pass = compile_program(scalar_gate.inverse_state_output_pass, (), DK=DK, DV=DV, chunk_size=CHUNK_SIZE,
                                     block_dv=block_dv, dtype=ops.dtype_name(q.dtype), value_groups=H // HQ,
                                     varlen=table is not None, initial_state=h0 is not None,
                                     final_state=output_final_state)
        h0, ht = ops.state_arguments(h0, output_final_state, N, H, DK, DV, device)
        o = ops.new_output((B, T, H, DV), v.dtype, device)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), Tb, G, scale, h0, o, ht, *tables)
    return queued(state_pass, args, device), o, (ht if output_final_state else None)


def _run_scalar_gate(q, k, v, g, beta, scale, h0, flags, table, output_final_state, check, block_dv):
    """GDN through ``kda.kernels.scalar_gate``: ``chunk_gated_inverse`` (``G`` and ``Tb``, checking
    ``g`` and ``beta`` as it reads them), then ``inverse_state_output_pass``. With the ``table`` of
    packed sequences, each kernel is one launch for all of them, as level 5's."""
    G, Tb = scalar_gate_inverse(k, g, beta, v.shape[2], flags, table)
    launch, o, ht = scalar_gate_pass_launch(q, k, v, Tb, G, scale, h0, block_dv, table, output_final_state)
    validate.launch_then_check(flags, launch, check)
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
            first kernel checks the keys only with ``KEY_CHECK_IN_KERNEL`` (off until its GPU tests pass).
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
