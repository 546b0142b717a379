"""Context parallel and the intra-card split for the gated delta rule (KDA, GDN).

A run of chunks acts on the state as an affine map ``S_end = M S_start + B``
(``kda.reference.level0.chunk_affine``, composed over its chunks). Both features use it:

* ``context_parallel``, over ``torch.distributed``: each rank holds a contiguous slice of the
  same batch of sequences along ``T`` (rank order is sequence order; lengths may differ). Every
  rank computes its slice's map with no initial state, the maps are all-gathered
  (``map_bytes`` per rank and map), rank ``r`` folds the maps of ranks ``0 .. r-1`` into its true
  starting state and recomputes its slice from it; the last rank holds the final state.
* ``split_forward``, one device: each sequence is cut into runs of whole chunks that play the
  ranks, all runs at once as one batch.

On CPU tensors the maps and the fold are float64 (``local_affine_map``, gloo for the
collective); on CUDA tensors the level-5 kernels compute them in float32 (``chunk_maps``: the
state pass from a zero start gives ``B``, the same pass with the identity as start and
``U = 0`` gives ``M``), and the chunk form is prepared once for the maps and the recompute.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kda import gated_delta, launch, validate
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda, kernel_inputs
from kda.kernels.build import sm_count
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.reference.common import repeat_to_value_heads, start_state

if TYPE_CHECKING:
    from kda.kernels.chunk_intra import ChunkForm


def _plain_forward(g):
    """``chunk_kda`` for a per-channel gate ``[B, T, H, K]``, ``chunk_gated_delta_rule`` for ``[B, T, H]``."""
    return chunk_kda if g.dim() == 4 else chunk_gated_delta_rule


def _unsplit(op):
    """``op`` with the op's own route through the split (``SPLIT_IN_OP``) off for the call: ``pieces=1`` is one
    pass."""
    def call(*args):
        routed = gated_delta.SPLIT_IN_OP
        gated_delta.SPLIT_IN_OP = False
        try:
            return op(*args)
        finally:
            gated_delta.SPLIT_IN_OP = routed
    return call


def _start_state32(h0, like):
    """CUDA paths: the float32 state before the first token (zeros shaped like ``like`` without one)."""
    return h0.float() if h0 is not None else torch.zeros_like(like)


# --8<-- [start:local_affine_map]
def local_affine_map(k, v, g, beta, chunk_size: int = CHUNK_SIZE):
    """``(M [B, H, K, K], B [B, H, K, V])`` of a whole slice, float64: the chunks' maps composed
    in order (``k, v, beta`` as in ``chunk_kda``; ``g`` per head or per channel)."""
    k, v, beta = (x.double().transpose(1, 2) for x in (k, v, beta))           # [B, H, T, ...]
    g = ref0.per_channel(g.double(), k.shape[-1]).transpose(1, 2)
    Bsz, H, T, K = k.shape
    eye = torch.eye(K, dtype=torch.float64, device=k.device).expand(Bsz, H, K, K)
    M, Bm = eye.clone(), torch.zeros(Bsz, H, K, v.shape[-1], dtype=torch.float64, device=k.device)
    for s in range(0, T, chunk_size):
        c = slice(s, min(s + chunk_size, T))
        M, Bm = ref0.compose((M, Bm), ref0.chunk_affine(k[:, :, c], v[:, :, c], g[:, :, c], beta[:, :, c]))
    return M, Bm
# --8<-- [end:local_affine_map]


# --8<-- [start:chunk_maps]
def chunk_maps(form: ChunkForm):
    """``(M [B, H, K, K], B [B, H, K, V])`` of every sequence of a prepared batch, float32, from
    the level-5 state pass: from a zero start it ends at ``B``; with ``U = 0`` it applies only
    the homogeneous part ``S -> M S``, so from the identity it ends at ``M``."""
    from kda.kernels.gated_state_pass import run_state_pass

    Bsz, _, H, K = form.W.shape
    _, Bm = run_state_pass(form, None)
    eye = torch.eye(K, dtype=torch.float32, device=form.W.device).expand(Bsz, H, K, K).contiguous()
    _, M = run_state_pass(form._replace(U=torch.zeros_like(form.W)), eye)
    return M, Bm
# --8<-- [end:chunk_maps]


def fold(state, maps):
    """The state entering each slice: ``S_0 = state``, ``S_{r+1} = M_r S_r + B_r`` for the maps
    ``[(M_0, B_0), ...]`` of the slices in order. Returns ``[S_0, ..., S_len(maps)]``."""
    states = [state]
    for M, Bm in maps:
        states.append(M @ states[-1] + Bm)
    return states


def map_bytes(B: int, H: int, K: int, V: int, elem_bytes: int = 8) -> int:
    """Bytes of one slice's map ``(M, B)``: what each rank contributes to the all-gather. A ring
    all-gather over ``P`` ranks makes every rank send ``(P - 1)`` of these."""
    return B * H * (K * K + K * V) * elem_bytes


# --8<-- [start:context_parallel]
def context_parallel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, group=None):
    """The forward of ``chunk_kda`` (``g [B, T_r, H, K]``) or ``chunk_gated_delta_rule``
    (``g [B, T_r, H]``) on this rank's slice of the sequence, exact across ranks. CPU tensors
    (gloo) or CUDA tensors (NCCL).

    ``initial_state`` is the state before the first token of the whole sequence; pass the same
    tensor (or ``None``) on every rank. Returns ``(o, final_state)`` for the local slice;
    ``final_state`` only on the last rank (``None`` elsewhere). Every slice needs at least one
    token; arguments are checked before the collective, so a bad argument raises on its rank
    while the others wait in the all-gather, as with any ``torch.distributed`` call."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    scale, h0, _ = validate.check_gated_delta_inputs(q, k, v, g, beta, scale, initial_state, None, g.dim() == 4)
    q, k = value_heads(q, k, v)
    if validate.runs_kernels(q):
        from kda.kernels.chunk_intra import prepare_chunks
        from kda.kernels.gated_state_pass import run_state_pass

        q, k, g = kernel_inputs(q, k, g, use_qk_l2norm_in_kernel)
        form = prepare_chunks(q, k, v, g, beta, scale)            # once: for the map and the recompute
        M, Bm = chunk_maps(form)
        S0 = _start_state32(h0, Bm)
    else:
        M, Bm = local_affine_map(ref4.l2_normalize(k.double()) if use_qk_l2norm_in_kernel else k, v, g, beta)
        S0 = start_state(q, v, h0)
    maps_M = [torch.empty_like(M) for _ in range(world)]
    maps_B = [torch.empty_like(Bm) for _ in range(world)]
    dist.all_gather(maps_M, M, group=group)
    dist.all_gather(maps_B, Bm, group=group)
    S = fold(S0, zip(maps_M[:rank], maps_B[:rank]))[-1]
    last = rank == world - 1
    if validate.runs_kernels(q):
        o, final = run_state_pass(form, S, output_final_state=output_final_state and last)
    else:
        o, final = _plain_forward(g)(q, k, v, g, beta, scale, S, True, use_qk_l2norm_in_kernel)
    return o, (final if output_final_state and last else None)
# --8<-- [end:context_parallel]


# --8<-- [start:warmup_chunks]
# A run's start from the trailing chunks of the run before it alone, where every head's gate (every channel's) falls
# over them by -WARMUP_FALL or more: the state before them reaches the start scaled by at most e^WARMUP_FALL (3.8e-11,
# under float32's rounding), since with keys within the delta rule's bound (beta ||k||^2 <= 2) no step of the
# window grows it. One pass over those windows then replaces the runs' maps and the fold (FlashQLA's intra-card
# split warms up the same way, to e^-10). Run 111 (H100): its GPU tests passed, and at (1, 131072, 4, 128) the split
# takes 1.34 ms against 1.90 for the exact split (GDN; KDA 1.62 against 2.22): on.
WARMUP_STARTS = True
WARMUP_FALL = -24.0
WARMUP_MIN_RUN_CHUNKS = 16


def warmup_chunks(falls, bound: float = WARMUP_FALL) -> int:
    """The window: the fewest trailing chunks of each run but the last over which every head's gate (every
    channel's) falls by ``-bound`` or more, the most of them over the batch, runs and heads; ``falls [B, P - 1,
    H, L, X]`` holds each chunk's fall (natural log, <= 0; ``X`` channels or 1). 0 where some run never falls that
    far (its start is then the exact one). One read back to the host."""
    reached = window_falls(falls) <= bound              # False .. False True .. True: the falls are <= 0
    return int(torch.where(reached[..., -1].all(), (~reached).sum(-1).amax() + 1, 0))


def window_falls(falls):
    """``[B, P - 1, H, L]``: how far the gate falls over the last 1, 2, .. L chunks of each run, its slowest channel's
    (``falls``: ``warmup_chunks``'s)."""
    return falls.flip(-2).cumsum(-2).amax(-1)


def window_keys_stable(k, beta, pieces: int, run_len: int, tokens: int) -> bool:
    """Whether ``beta ||k||^2 <= 2`` on every token of the windows, the last ``tokens`` of each run but the last
    (``k [B, T, H, K]`` as the kernels read it, ``beta [B, T, H]``): then no step there can grow the state, and the
    bound of ``warmup_chunks`` holds. One read back to the host."""
    return float(window_key_load(k, beta, pieces, run_len, tokens)) <= 2.0


def window_key_load(k, beta, pieces: int, run_len: int, tokens: int):
    """The largest ``beta ||k||^2`` over the windows' tokens, a 0-d tensor (nothing read back); ``k`` may have
    fewer heads than ``beta`` (grouped value heads: value head ``i`` reads key head ``i // (HV / H)``)."""
    tail = lambda x: x[:, :(pieces - 1) * run_len].reshape(x.shape[0], pieces - 1, run_len,
                                                          *x.shape[2:])[:, :, -tokens:]
    norms = tail(k).float().square().sum(-1)                  # [B, P - 1, tokens, H]
    betas = tail(beta).float()
    return (betas.reshape(*norms.shape, -1) * norms[..., None]).amax()


def gate_falls(g, pieces: int, run_len: int, chunk_size: int):
    """``[B, pieces - 1, H, L, X]``: each chunk's gate fall in every run but the last (``g [B, T, H(, K)]``, log
    gates; the runs ``run_len`` tokens of whole chunks)."""
    g = g if g.dim() == 4 else g[..., None]
    B, _, H, X = g.shape
    runs = g[:, :(pieces - 1) * run_len].double().reshape(B, pieces - 1, run_len // chunk_size, chunk_size, H, X)
    return runs.sum(3).transpose(2, 3)
# --8<-- [end:warmup_chunks]


# GDN's split by the scalar-gate path: its passes take 128 value columns per block, so the runs are
# what fills the SMs. Off: run 89 timed it slower than level 5's split (best 2.11 ms, with 33 runs,
# against 1.77 ms at (1, 131072, 4, 128); FlashQLA 0.44).
SCALAR_GATE_SPLIT = False
SCALAR_GATE_MIN_RUN_CHUNKS = 32


def _splits_by_scalar_gate(g) -> bool:
    """Whether GDN's split goes through the scalar-gate path (both switches on, one gate per head)."""
    return g.dim() == 3 and gated_delta.SCALAR_GATE_PATH and SCALAR_GATE_SPLIT


# --8<-- [start:choose_pieces]
def choose_pieces(B: int, H: int, DV: int, T: int, sm_count: int, block_dv: int = 32,
                  chunk_size: int = CHUNK_SIZE, min_run_chunks: int | None = None, warmup: bool = False) -> int:
    """How many runs to cut each sequence into. The state pass gets ``B * H * DV / block_dv``
    blocks, one per SM; P runs multiply that by P but make three passes (B, M, the recompute)
    instead of one, so a split pays only from about 4 runs on, and only while the blocks do not
    already fill the SMs. On the H200 at T = 8192 every split lost to the fixed cost of the maps
    and the fold, runs of 64, 32 and 16 chunks alike (``snippets/cp/split_latency.py``), and once
    the state pass was warp-specialised 8 runs of 64 chunks lost too (0.76x at B, T, H = 1, 32768,
    4; run 39 in results/tuning): a floor of 256 chunks per run keeps such lengths unsplit.
    With ``warmup`` starts (``warmup_chunks``) the maps and the fold give way to one pass over a few
    chunks per run, so two runs pay already and the floor is ``WARMUP_MIN_RUN_CHUNKS`` (unless given)."""
    blocks = B * H * ceildiv(DV, block_dv)
    floor = min_run_chunks or (WARMUP_MIN_RUN_CHUNKS if warmup else 256)
    pieces = min(sm_count // blocks, ceildiv(T, chunk_size) // floor)
    return pieces if pieces >= (2 if warmup else 4) else 1
# --8<-- [end:choose_pieces]


def whole_runs(chunks: int, pieces: int, chunk_size: int = CHUNK_SIZE) -> tuple[int, int]:
    """``(pieces, run length in tokens)``: ``chunks`` cut into runs of whole chunks, as even as can be, none empty
    (fewer than ``pieces`` where they would be)."""
    run_chunks = ceildiv(chunks, pieces)
    return ceildiv(chunks, run_chunks), run_chunks * chunk_size


# --8<-- [start:runs_form]
def runs_form(form: ChunkForm, pieces: int) -> ChunkForm:
    """A prepared batch ``[B, P * L, H, *]`` seen as ``B * P`` sequences of ``L`` tokens (whole
    chunks): the per-token tensors are views; the chunk decay ``[B, H, NC, K]`` is reordered
    (``B * H * NC * K`` floats)."""
    B, T, H, K = form.W.shape
    NC = form.decay.shape[2]
    if T % pieces or NC % pieces or NC * CHUNK_SIZE != T:
        raise ValueError(f"runs_form needs T = pieces * whole chunks, got T = {T}, pieces = {pieces}")
    view = lambda x: x.reshape(B * pieces, T // pieces, *x.shape[2:])
    decay = form.decay.reshape(B, H, pieces, NC // pieces, K).transpose(1, 2).contiguous()
    return form._replace(Qw=view(form.Qw), Kw=view(form.Kw), W=view(form.W), U=view(form.U), A_qk=view(form.A_qk),
                         decay=decay.reshape(B * pieces, H, NC // pieces, K))
# --8<-- [end:runs_form]


# --8<-- [start:split_forward]
def split_forward(q, k, v, g, beta, pieces: int | None = None, scale=None, initial_state=None,
                  output_final_state=False, use_qk_l2norm_in_kernel=False, chunk_size: int = CHUNK_SIZE,
                  warmup: bool | None = None):
    """Intra-card split, the affine chain on one device: each sequence is cut into ``pieces`` runs
    of whole chunks; every run's map ``(M, B)`` is computed with no initial state (on a GPU all
    runs at once, as a batch of ``B * pieces`` sequences), the maps are folded in order into each
    run's true starting state, and every run is recomputed from it. Same arguments and results
    as ``chunk_kda`` (``g [B, T, H, K]``) or ``chunk_gated_delta_rule`` (``g [B, T, H]``), without
    ``cu_seqlens``. ``pieces=None`` lets ``choose_pieces`` decide from the device's SM count (CUDA).
    ``warmup`` (``None``: ``WARMUP_STARTS`` on CUDA, off on the CPU) starts each run but the first from
    the window of ``warmup_chunks`` instead, where the gates fall far enough and the window's keys are
    stable (else the exact starts)."""
    if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 1):
        raise ValueError(f"pieces must be a positive int or None, got {pieces!r}")
    scale, h0, _ = validate.check_gated_delta_inputs(q, k, v, g, beta, scale, initial_state, None, g.dim() == 4)
    q, k = value_heads(q, k, v)
    if validate.runs_kernels(q) and chunk_size != CHUNK_SIZE:
        raise ValueError(f"chunk_size must be {CHUNK_SIZE} on CUDA (the kernels' chunk), got {chunk_size}")
    if warmup is None:
        warmup = WARMUP_STARTS and validate.runs_kernels(q)
    B, T, H = v.shape[:3]                                     # H: the value heads
    chunks = ceildiv(T, chunk_size)
    # runs chosen for warm-up starts that exact starts would not pay for: where no window serves, no split
    unsplit_without_window = False
    if pieces is None:
        sms = sm_count(q.device) if validate.runs_kernels(q) else 1
        rule = (dict(block_dv=gated_delta.SCALAR_GATE_COLUMNS, min_run_chunks=SCALAR_GATE_MIN_RUN_CHUNKS)
                if _splits_by_scalar_gate(g) else {})
        pieces = choose_pieces(B, H, v.shape[-1], T, sms, chunk_size=chunk_size, warmup=warmup, **rule)
        unsplit_without_window = warmup and choose_pieces(B, H, v.shape[-1], T, sms, chunk_size=chunk_size, **rule) == 1
    pieces, run_len = whole_runs(chunks, pieces, chunk_size)
    if pieces == 1:                                           # nothing to fold: one pass, never the op's own split
        return _unsplit(_plain_forward(g))(q, k, v, g, beta, scale, initial_state, output_final_state,
                                           use_qk_l2norm_in_kernel)
    if validate.runs_kernels(q):
        return _split_forward_cuda(q, k, v, g, beta, pieces, run_len, scale, h0, output_final_state,
                                   use_qk_l2norm_in_kernel, warmup, unsplit_without_window)
    runs = [slice(s, min(s + run_len, T)) for s in range(0, T, run_len)]
    k_map = ref4.l2_normalize(k.double()) if use_qk_l2norm_in_kernel else k
    window = _window(gate_falls(g, pieces, run_len, chunk_size), k_map, beta, pieces, run_len, chunk_size) \
        if warmup else 0
    if warmup and not window and unsplit_without_window:
        return _plain_forward(g)(q, k, v, g, beta, scale, initial_state, output_final_state,
                                 use_qk_l2norm_in_kernel)
    windows = [slice(r.stop - window * chunk_size, r.stop) for r in runs[:-1]]
    if window:
        # each run's start: the state its window leaves from zero, the plain forward's arithmetic
        starts = [start_state(q, v, h0)] + [
            _plain_forward(g)(q[:, w], k[:, w], v[:, w], g[:, w], beta[:, w], scale, None, True,
                              use_qk_l2norm_in_kernel)[1] for w in windows]
    else:
        # the last run's map is not needed: the final state comes from its recompute
        maps = [local_affine_map(k_map[:, r], v[:, r], g[:, r], beta[:, r], chunk_size) for r in runs[:-1]]
        starts = fold(start_state(q, v, h0), maps)
    outputs = []
    for r, S0 in zip(runs, starts):
        o, final = _plain_forward(g)(q[:, r], k[:, r], v[:, r], g[:, r], beta[:, r], scale, S0, True,
                                     use_qk_l2norm_in_kernel)
        outputs.append(o)
    return torch.cat(outputs, dim=1), (final if output_final_state else None)


# The op's route (kda.gated_delta.SPLIT_IN_OP) splits only runs of this many chunks or more. Run 117 (H100, ms): GDN at
# (1, 131072, 4) 0.857 / 0.681 / 0.999 with runs of 128 / 64 / 32 chunks or more (33 runs of 63 chunks pad the
# sequence), at (1, 65536, 4) 0.779 / 0.619 / 0.639; KDA's split, 8 runs at both floors, within noise.
OP_SPLIT_MIN_RUN_CHUNKS = 64
# ... and only where the unsplit op is long: a sequence of OP_SPLIT_MIN_CHUNKS chunks or more (its state pass's chain),
# or, for GDN by the scalar-gate pass, OP_SPLIT_MIN_HEAD_TOKENS tokens times heads or more (level 5's path, which the
# op takes for want of blocks, is then slow by its work). Run 114 (H100, ms, the routed op against the op):
# (1, 131072, 4) GDN 2.21 / 2.59, KDA 1.55 / 2.88; (1, 32768, 32) GDN 1.53 / 1.76; but (1, 32768, 4) GDN 1.51 / 0.67.
OP_SPLIT_MIN_CHUNKS = 1024
OP_SPLIT_MIN_HEAD_TOKENS = 1 << 20


def op_split(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, check_values):
    """``chunk_kda`` / ``chunk_gated_delta_rule`` on CUDA (dense, inputs checked but for their values) through the
    split with warm-up starts where ``choose_pieces`` splits runs of ``OP_SPLIT_MIN_RUN_CHUNKS`` or more of a long
    call (``OP_SPLIT_MIN_CHUNKS``, ``OP_SPLIT_MIN_HEAD_TOKENS``); ``None`` elsewhere (the op's own path). GDN takes
    the scalar-gate pass where the op's would be level 5's for want of blocks. ``check_values``: the gate's and
    ``beta``'s ranges (and raw keys against the delta rule's bound, with ``KEY_CHECK_IN_KERNEL``) checked by the
    split's first kernel as it reads them, as the op's own path checks them, and read back with the window's check
    once the passes are queued, waiting for neither pass (run 112: the checks read back first, by torch, took 0.35
    ms of the op's 1.80 at (1, 32768, 32, 128), more than the split saved)."""
    if not WARMUP_STARTS or (v.shape[2] != q.shape[2] and not SPLIT_GROUPED_VALUES):
        return None
    from kda.kernels import build                             # its sm_count, as the launchers ask it

    B, T, _, _ = q.shape
    H, DV, sms = v.shape[2], v.shape[-1], build.sm_count(q.device)     # H: the value heads, the blocks' count
    chunks = ceildiv(T, CHUNK_SIZE)
    scalar = g.dim() == 3 and gated_delta.SCALAR_GATE_PATH and gated_delta.scalar_gate_columns(B, H, DV, sms) is None
    if chunks < OP_SPLIT_MIN_CHUNKS and not (scalar and B * H * T >= OP_SPLIT_MIN_HEAD_TOKENS):
        return None
    rule = dict(block_dv=gated_delta.SCALAR_GATE_COLUMNS) if scalar else {}
    pieces = choose_pieces(B, H, DV, T, sms, min_run_chunks=OP_SPLIT_MIN_RUN_CHUNKS, warmup=True, **rule)
    if pieces == 1:
        return None
    flags = gated_delta.first_kernel_flags(True, use_qk_l2norm_in_kernel, q.device) if check_values else None
    check = (lambda host: validate.raise_flagged_inputs(host, g, beta, k)) if check_values else None
    # keys checked everywhere: by the first kernel (a third flag), or normalized (beta <= 1 is checked)
    keys_checked = check_values and (flags.numel() == 3 or use_qk_l2norm_in_kernel)
    pieces, run_len = whole_runs(chunks, pieces)
    exact_pays = choose_pieces(B, H, DV, T, sms, **rule) > 1
    return _split_forward_cuda(q, k, v, g, beta, pieces, run_len, scale, h0, output_final_state,
                               use_qk_l2norm_in_kernel, True, not exact_pays, scalar_gate=scalar, flags=flags,
                               check=check, keys_checked=keys_checked)


# CUDA: grouped value heads through the split and context parallelism. Run 121 (H100): with q and k repeated to the
# value heads, its GPU tests (the grouped cases of test_op_takes_the_split) passed, and GDN at (1, 32768, 16 q/k heads,
# 32 value heads) took 1.50 ms split against 1.74 unsplit, at (1, 131072, 2/4) 1.41 against 2.59: on. Run 122 found
# the repeat (repeat_interleave) taking 0.28 ms for each of q and k there, so the kernels now read the grouped heads
# themselves (value_groups, as the unsplit op's do); that form's GPU test is the same one.
SPLIT_GROUPED_VALUES = True


def value_heads(q, k, v):
    """``q`` and ``k`` as the split and context parallelism take them (grouped value heads: value head ``i``
    reads query and key head ``i // (HV / H)``): on CUDA as they are (the kernels read the grouped heads, compiled
    with ``value_groups``; grouped heads need ``SPLIT_GROUPED_VALUES``), on the CPU repeated to a head per value
    head for the float64 paths."""
    if v.shape[2] == q.shape[2]:
        return q, k
    if validate.runs_kernels(q):
        from kda import cuda_paths

        cuda_paths.require(cuda_paths.by_name("split_grouped_values"), "the split of grouped value heads")
        return q, k
    return repeat_to_value_heads(q, k, v.shape[2])


# GDN's split by the scalar-gate passes reading a ragged last run where it lies (their ``runs`` form: each sequence's
# runs as sequences of their own, the last one short) instead of padding q, k, v, g and beta to whole runs and cutting
# o back. A dense call whose T is not a whole number of runs took twice as long (run 157, H100: T = 33,606 at 1.575 ms
# against 0.735 at 33,536, 1.05 ms of it the copies). Run 160 (H100, 32 heads of 128, bf16): T = 33,606 1.553 -> 1.060
# ms, 36,924 1.709 -> 1.075, 32,769 1.531 -> 1.105, whole runs (33,536) 0.733 -> 0.741 (FlashQLA 0.800, 0.892, 0.776,
# 0.760); o the same bits, the final state within rounding of the padded split's (test_split_ragged_runs's bound on
# it set from run 160's one case that differed). Run 161 (H100): its GPU tests passed; in a process of its own
# T = 33,606 took 0.749 ms, as whole runs do (0.751 at 33,536; the unsplit op 1.805): on.
RAGGED_RUNS = True


def _pad_time(x, pad: int):
    """Zero tokens at the end of ``[B, T, ...]``: with k = v = 0, b = 0 and log gate 0 they are
    identity steps of the recurrence."""
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))


def _split_forward_cuda(q, k, v, g, beta, pieces, run_len, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                        warmup=False, unsplit_without_window=False, scalar_gate=None, flags=None, check=None,
                        keys_checked=False):
    """``split_forward`` on CUDA in ``pieces`` runs of ``run_len`` tokens. ``flags``: the first kernel checks the
    values as it reads them, and ``check(flags on the host)`` raises on a flagged one (``_warm_or_exact``);
    ``keys_checked``: every key is known to be within the delta rule's bound."""
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.kernels.gated_state_pass import run_state_pass

    B, T, H = v.shape[:3]                                     # H: the value heads (q and k may have fewer)
    if scalar_gate is None:                                   # by the switches; before g becomes [B, T, H, 1]
        scalar_gate = _splits_by_scalar_gate(g)
    q, k, g = kernel_inputs(q, k, g, use_qk_l2norm_in_kernel)
    ragged = scalar_gate and RAGGED_RUNS                      # the passes read the last run where it lies
    pad = 0 if ragged else pieces * run_len - T               # only ever inside the last run
    if pad:
        q, k, v, g, beta = (_pad_time(x, pad) for x in (q, k, v, g, beta))
    if scalar_gate:
        o, final = _split_scalar_gate(q, k, v, g, beta, pieces, run_len, scale, h0, warmup, unsplit_without_window,
                                      flags, check, keys_checked, output_final_state, ragged)
        o = o[:, :T]
        return (o.contiguous() if pad else o), (final if output_final_state else None)
    form = prepare_chunks(q, k, v, g, beta, scale, flags=flags)      # flags: the values checked as they are read
    runs = runs_form(form, pieces)                            # every chunk of every run at once

    def from_starts(starts):
        o, ht = run_state_pass(runs, starts)
        return o.reshape(B, pieces * run_len, H, -1), ht.reshape(B, pieces, *ht.shape[1:])[:, -1].contiguous()

    def warm(window):
        return from_starts(_warm_starts(h0, run_state_pass(window_form(runs, B, pieces, window), None)[1], B, pieces))

    def exact():
        if warmup and unsplit_without_window:                 # the one pass, unsplit
            return run_state_pass(form, h0.float() if h0 is not None else None)
        return from_starts(_folded_starts(h0, *(x.reshape(B, pieces, *x.shape[1:]) for x in chunk_maps(runs))))

    falls = runs.decay.reshape(B, pieces, H, -1, runs.decay.shape[-1])[:, :-1].log() if warmup else None
    o, final = _warm_or_exact(("level5", B, H, pieces, run_len), warmup, falls, k, beta, pieces, run_len, warm, exact,
                              flags, check, keys_checked)
    o = o[:, :T]
    return (o.contiguous() if pad else o), (final if output_final_state else None)


# The window each split of these sizes last needed ((path, B, H, pieces, run length) -> chunks; 0: none served), so
# that the next call launches its passes on it and checks it on the device behind them (one read back, as the op's
# value flags), instead of reading the window back before it can launch them (run 108: 0.921 ms against 0.398 for
# the exact split, which makes more passes, at (1, 8192, 4, 128)). The largest window seen is kept: a model's layers
# differ in their gates.
WARMUP_WINDOWS: dict = {}


def _warm_or_exact(key, warmup, falls, k, beta, pieces, run_len, warm, exact, flags=None, check=None,
                   keys_checked=False):
    """CUDA: with ``warmup``, ``warm(window)`` on the window remembered for ``key`` (one chunk at first), checked on
    the device (``window_serves``); where it does not serve, the window read back (``_window``) and ``warm`` again
    on it, or ``exact()`` where none serves; without, ``exact()``. ``flags``: the first kernel's value flags, read
    back with the window's check in one copy that waits for them alone, not for the passes
    (``validate.launch_then_check``), so that the call returns while the passes run; ``check(host flags)`` then
    raises on a flagged value. ``keys_checked``: every key was checked against the delta rule's bound already (the
    window's own check of them is left out)."""
    guess = min(WARMUP_WINDOWS.get(key, 1), run_len // CHUNK_SIZE) if warmup else 0
    if guess:
        served = window_serves(falls, k, beta, pieces, run_len, guess, not keys_checked).reshape(1).to(torch.int32)
        signal = served if flags is None else torch.cat((flags, served))
        got, read = [], []
        validate.launch_then_check(signal, lambda: got.append(warm(guess)), read.append)
        if check is not None:
            check(read[0][:-1])
        if read[0][-1]:
            return got[0]
    elif check is not None:
        check(flags)
    if not warmup:
        return exact()
    window = _window(falls, k, beta, pieces, run_len)
    WARMUP_WINDOWS[key] = max(window, guess) if window else 0
    return warm(window) if window else exact()


def window_serves(falls, k, beta, pieces: int, run_len: int, window: int, keys: bool = True):
    """On the device, nothing read back: whether ``window`` trailing chunks of every run but the last bring every
    gate down by ``-WARMUP_FALL`` (``falls [B, P - 1, H, L, X]``, ``warmup_chunks``'s) and, with ``keys``, hold only
    stable keys (``window_keys_stable``'s test; a caller whose keys were checked everywhere leaves it out). A 0-d
    bool tensor."""
    served = falls[..., -window:, :].sum(-2).amax() <= WARMUP_FALL
    return served & (window_key_load(k, beta, pieces, run_len, window * CHUNK_SIZE) <= 2.0) if keys else served


def _folded_starts(h0, M, Bm):
    """CUDA: every run's exact start, ``[B * P, H, K, V]``, from the runs' maps ``M [B, P, H, K, K]`` and
    ``Bm [B, P, H, K, V]`` folded from the first state (the last run's map is not needed)."""
    B, P = Bm.shape[:2]
    starts = fold(_start_state32(h0, Bm[:, 0]), [(M[:, p], Bm[:, p]) for p in range(P - 1)])
    return torch.stack(starts, dim=1).reshape(B * P, *Bm.shape[2:])


def _window(falls, k, beta, pieces, run_len, chunk_size=CHUNK_SIZE):
    """The warm-up window in chunks (0: exact starts) from ``falls [B, pieces - 1, H, L, X]``, the log of each
    chunk's decay in every run but the last, and the keys as the kernels read them."""
    window = warmup_chunks(falls)
    return window if window and window_keys_stable(k, beta, pieces, run_len, window * chunk_size) else 0


def window_form(runs: ChunkForm, B: int, pieces: int, chunks: int) -> ChunkForm:
    """The last ``chunks`` chunks of every run but the last of ``runs_form``'s batch, as a batch of ``B (pieces -
    1)`` sequences (copies: ``chunks * C`` tokens of each)."""
    tokens = chunks * CHUNK_SIZE
    tail = lambda x: x.reshape(B, pieces, *x.shape[1:])[:, :-1, -tokens:].reshape(-1, tokens, *x.shape[2:]).contiguous()
    decay = runs.decay.reshape(B, pieces, *runs.decay.shape[1:])[:, :-1, :, -chunks:]
    return runs._replace(Qw=tail(runs.Qw), Kw=tail(runs.Kw), W=tail(runs.W), U=tail(runs.U), A_qk=tail(runs.A_qk),
                         decay=decay.reshape(-1, *decay.shape[2:]).contiguous())


def _warm_starts(h0, ends, B, pieces):
    """``[B pieces, H, K, V]`` float32: each sequence's start (``h0``, zeros without one), then the ends of the
    windows of its runs but the last."""
    ends = ends.reshape(B, pieces - 1, *ends.shape[1:])
    return torch.cat([_start_state32(h0, ends[:, 0])[:, None], ends], dim=1).reshape(B * pieces, *ends.shape[2:])


def _split_scalar_gate(q, k, v, g, beta, pieces, run_len, scale, h0, warmup=False, unsplit_without_window=False,
                       flags=None, check=None, keys_checked=False, output_final_state=True, ragged=False):
    """GDN's split by ``kda.kernels.scalar_gate``: the inverse once for every chunk, then each run's map
    by the pass over a batch of ``B * pieces`` runs (``M`` from the identity with ``V = 0``, ``B`` from
    zero), the fold, and the pass again from each run's true start; with ``warmup``, where the gates allow,
    the pass over each run's window instead of the maps and the fold (where none serves and
    ``unsplit_without_window``, the pass over whole sequences). ``q, k, v, g [B, T, H, 1], beta`` cut into runs of
    ``run_len`` tokens: padded to whole runs and seen as a batch of ``B * pieces``, or with ``ragged`` as they lie,
    the last run short, by the kernels' ``runs`` form; returns ``o`` and the final state (``None`` without
    ``output_final_state``, after warm-up starts).
    ``flags``: the inverse checks the values as it reads them; ``check`` and ``keys_checked`` as
    ``_warm_or_exact`` takes them."""
    from kda.kernels.scalar_gate import scalar_gate_inverse, scalar_gate_pass_launch

    B, T, H = v.shape[:3]                                     # H: the value heads (q and k may have fewer)
    K, DV, L, R = k.shape[-1], v.shape[-1], run_len, B * pieces
    from kda.kernels import scalar_gate

    gate_free = scalar_gate.GATE_FREE_INVERSE or scalar_gate.GATE_FREE_IN_SPLIT
    G_runs, Tb = scalar_gate_inverse(k, g, beta, H, flags, runs=pieces, gate_free=gate_free)   # runs in rows of G
    block = lambda D: min(gated_delta.SCALAR_GATE_COLUMNS, D)            # the pieces were chosen to fill the SMs
    pass_from = lambda q, k, v, Tb, G, start, **kw: launch.launched(
        scalar_gate_pass_launch(q, k, v, Tb, G, scale, start, block(v.shape[-1]), gate_free=gate_free, **kw))
    # the runs as the passes take them: views of whole runs (padded), or the tensors as they lie (ragged)
    runs = (lambda x: x) if ragged else (lambda x: x.reshape(R, L, *x.shape[2:]))
    by_runs = dict(runs=pieces) if ragged else {}
    # G holds log2 of the gate's cumsum in each chunk: the chunk's fall is its last row's
    falls = G_runs.view(B, pieces, H, L)[:, :-1, :, CHUNK_SIZE - 1::CHUNK_SIZE][..., None] * math.log(2) \
        if warmup else None

    def from_starts(starts, final=True, out=None):
        # the runs as a batch, G_runs made so by the inverse (as packed sequences of one row the pass took 0.60 ms
        # against 0.51 at (1, 131072, 4, 128): run 116)
        o, ht = pass_from(runs(q), runs(k), runs(v), runs(Tb), G_runs, starts, output_final_state=final,
                          out=None if out is None else runs(out), **by_runs)
        return o.reshape(B, T, H, DV), (ht.reshape(B, pieces, H, K, DV)[:, -1].contiguous() if final else None)

    def warm(window):
        # the windows where they lie (the pass from chunk L / C - window of every run, no copies), their ends into
        # ends[1:], so that ends[r] is run r's start once each sequence's first is put in; the window pass's
        # outputs go where the second pass writes all of its own
        ends = torch.empty(R + 1, H, K, DV, dtype=torch.float32, device=v.device)
        o = launch.new_output((B, T, H, DV), v.dtype, v.device)
        pass_from(runs(q), runs(k), runs(v), runs(Tb), G_runs, None, first_chunk=L // CHUNK_SIZE - window,
                  out=runs(o), final=ends[1:], **by_runs)
        firsts = ends[:R].view(B, pieces, H, K, DV)[:, 0]
        if h0 is None:
            firsts.zero_()
        else:
            firsts.copy_(h0)
        return from_starts(ends[:R], output_final_state, o)

    def exact():
        if warmup and unsplit_without_window:                 # the pass over whole sequences, G as they lie
            G = G_runs.view(B, pieces, H, L).transpose(1, 2).reshape(B, H, pieces * L)
            G = G[..., :ceildiv(T, CHUNK_SIZE) * CHUNK_SIZE].contiguous()   # ragged: the last run's unwritten rows
            return pass_from(q, k, v, Tb, G, h0.float() if h0 is not None else None)
        homogeneous = torch.zeros(B, T, H, K, dtype=v.dtype, device=v.device)
        eye = torch.eye(K, dtype=torch.float32, device=q.device).expand(R, H, K, K).contiguous()
        return from_starts(_folded_starts(h0, *(                            # M, then B
            pass_from(runs(q), runs(k), runs(values), runs(Tb), G_runs, start, **by_runs)[1]
            .reshape(B, pieces, H, K, -1) for values, start in ((homogeneous, eye), (v, None)))))

    return _warm_or_exact(("scalar_gate", B, H, pieces, L), warmup, falls, k, beta, pieces, L, warm, exact, flags,
                          check, keys_checked)
# --8<-- [end:split_forward]
