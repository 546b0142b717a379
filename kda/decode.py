"""Decode: the gated delta rule a token at a time, shaped like fla 0.6.0's ``fused_recurrent_kda``
and ``fused_recurrent_gated_delta_rule``.

Serving runs a chunked prefill (``kda.chunk_kda``) and then one to a few tokens per sequence per
step. Each step reads every state and writes it back, ``O(DK DV)`` work per token: the kernel
(``kda.kernels.decode.fused_recurrent``) streams the states through registers. On the CPU the
float64 token recurrence (``kda.reference.level0.recurrent``).

Continuous batching keeps the states of all live sequences in a pool ``[P, HV, K, V]`` (float32);
with ``ssm_state_indices [N]`` sequence ``n`` starts from slot ``ssm_state_indices[n]`` of
``initial_state`` and its final state is written back to that slot, in place.

Speculative decoding (fla's ``num_accepted_tokens``): a verify step runs each sequence's drafted tokens
and keeps the state after every one of them, since the next step resumes from the last token the
sampler accepted. With ``ssm_state_indices [N, T_max]`` the state after token ``t`` of sequence ``n``
goes to slot ``ssm_state_indices[n, t]``, and the sequence starts from slot
``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` (from ``ssm_state_indices[n, 0]`` without
``num_accepted_tokens``): the slot of the last token the previous step kept.

fla's activations are done by the kernel as it reads each token: ``use_gate_in_kernel`` with
``A_log``, ``dt_bias`` (and ``lower_bound`` for the bounded form), ``use_beta_sigmoid_in_kernel``
(``allow_neg_eigval``). ``state_v_first`` is not supported.

The value checks of ``g``, ``beta`` and the pool slots run on the GPU (``value_checks``) before the
kernel, which writes nothing if they flagged a value; the host reads their three flags once the
kernel is queued (a wait for the checks only) and then names the bad value. With ``DEFERRED_CHECKS``
the host does not wait at all: the flags are read at the start of the next decode call (by then long
copied), or by ``raise_pending_checks()``, and a flagged step's error is raised there. They are skipped while
a CUDA graph is being captured and under ``torch.compile`` (nowhere else): without them the launch
path reads and copies nothing, so a decode step can be captured once and replayed.
"""

from __future__ import annotations

import torch

from kda import validate
from kda.activation import check_activation
from kda.gated_delta import kernel_inputs
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.reference.common import repeat_to_value_heads


# CUDA: a checked decode step does not wait for its checks; their flags are read at the next decode call (or by
# raise_pending_checks), which raises the flagged step's error before it does anything. The flagged step wrote
# nothing (the guarded kernel), so a pool is as it was. Run 111 (H100): its GPU tests passed, but the step took as long
# as the waiting one (KDA at batch 1: 0.0757 ms against 0.0758; unchecked 0.0078): the host's cost is the checks'
# launches and the copy, not the wait. Off: it only moves the error to a later call.
DEFERRED_CHECKS = False
_pending_checks: list = []      # read(): waits for a step's copied flags, raises if one is set


def raise_pending_checks() -> None:
    """Read the value checks of the decode steps that ran with ``DEFERRED_CHECKS`` and have not been read
    yet, and raise the first one's error if it flagged a value (a step whose outputs the caller has already
    taken: that step wrote nothing, neither outputs nor states). Every decode call does this first; call it
    after the last step of a run."""
    pending = _pending_checks[:]
    _pending_checks.clear()
    errors = []
    for read in pending:
        try:
            read()
        except ValueError as e:
            errors.append(e)
    if errors:
        raise ValueError(f"an earlier decode step (checked on the GPU, read now) had a bad value: {errors[0]}") \
            from errors[0]


def check_state_pool(pool, indices, N: int, H: int, DK: int, DV: int, device, check_values: bool):
    """``pool [P, H, DK, DV]`` float32, contiguous, on ``device`` (it is written in place) and
    ``indices [N]`` integers on ``device``; with ``check_values`` the indices are read back and
    must be distinct slots in ``[0, P)`` (two sequences writing one slot would race)."""
    if not isinstance(pool, torch.Tensor) or pool.dim() != 4 or tuple(pool.shape[1:]) != (H, DK, DV):
        got = validate.shape_of(pool) if isinstance(pool, torch.Tensor) else repr(pool)
        raise ValueError(f"with ssm_state_indices, initial_state must be the state pool [P, H, DK, DV] with "
                         f"(H, DK, DV) = {(H, DK, DV)}, got {got}")
    validate.no_backward_on_cuda("initial_state", pool)
    if pool.dtype != torch.float32 or not pool.is_contiguous() or pool.device != device:
        raise ValueError(f"the state pool is written in place: it must be float32, contiguous and on {device}, "
                         f"got {pool.dtype}, contiguous={pool.is_contiguous()}, on {pool.device}")
    if not isinstance(indices, torch.Tensor) or indices.shape != (N,) or indices.is_floating_point() \
            or indices.device != device:
        raise ValueError(f"ssm_state_indices must be an integer tensor [N] = [{N}] on {device} (one pool slot per "
                         f"sequence), got {indices!r}")
    if check_values:
        slots = indices.tolist()
        if any(not 0 <= s < pool.shape[0] for s in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"ssm_state_indices must be distinct slots in [0, {pool.shape[0]}), got {slots}")


def check_token_slots(pool, indices, accepted, lengths, N: int, H: int, DK: int, DV: int, device,
                      check_values: bool):
    """Speculative decoding's slots: ``indices [N, T_max]`` integers on ``device`` (the state after token
    ``t`` of sequence ``n`` to slot ``indices[n, t]``), ``accepted [N]`` integers on ``device`` or ``None``,
    ``pool`` as ``check_state_pool`` wants it; ``lengths``: the sequences' token counts (host ints, or
    ``None`` where they stay on the device, in a CUDA graph). With ``check_values`` (read back): every
    length at most ``T_max``, ``accepted`` in ``[1, T_max]``, each slot a sequence reads or writes in ``[0,
    P)``, the written slots distinct, and no sequence starting from a slot that another one writes (the
    blocks of different sequences run at once). Slots past a sequence's length are neither read nor
    written, so they may hold anything (vLLM pads with -1)."""
    if indices.shape[0] != N:
        raise ValueError(f"ssm_state_indices [N, T_max] must have a row per sequence (N = {N}), got "
                         f"{tuple(indices.shape)}")
    TI = indices.shape[1]
    check_state_pool(pool, indices[:, 0], N, H, DK, DV, device, check_values=False)   # the pool; integer slots
    if accepted is not None and (not isinstance(accepted, torch.Tensor) or accepted.shape != (N,)
                                 or accepted.is_floating_point() or accepted.device != device):
        raise ValueError(f"num_accepted_tokens must be an integer tensor [N] = [{N}] on {device} (the tokens of "
                         f"the previous step each sequence kept, at least 1), got {accepted!r}")
    if not check_values or lengths is None:
        return
    if max(lengths, default=0) > TI:
        raise ValueError(f"ssm_state_indices [N, T_max] = {tuple(indices.shape)} has a slot per token: a sequence "
                         f"of {max(lengths)} tokens needs T_max >= {max(lengths)}")
    starts = accepted.tolist() if accepted is not None else [1] * N
    if any(not 1 <= a <= TI for a in starts):
        raise ValueError(f"num_accepted_tokens must lie in [1, {TI}] (T_max of ssm_state_indices): got {starts}")
    table, P = indices.tolist(), pool.shape[0]
    written = [(n, table[n][t]) for n in range(N) for t in range(lengths[n])]
    read = [(n, table[n][starts[n] - 1]) for n in range(N)]
    used = [slot for _, slot in written + read]
    if any(not 0 <= slot < P for slot in used):
        raise ValueError(f"ssm_state_indices: every slot a sequence reads or writes must lie in [0, {P}), got "
                         f"{sorted(set(slot for slot in used if not 0 <= slot < P))}")
    if len({slot for _, slot in written}) != len(written):
        raise ValueError("ssm_state_indices: two tokens would write one slot (each token's state needs its own)")
    owner = {slot: n for n, slot in written}
    clash = [(n, slot) for n, slot in read if owner.get(slot, n) != n]
    if clash:
        n, slot = clash[0]
        raise ValueError(f"ssm_state_indices: sequence {n} starts from slot {slot}, which sequence {owner[slot]} "
                         f"writes in the same step")


def check_values_on_host(g, beta, options, pool, indices, N: int):
    """The value checks of a step, read back: ``g`` finite and ``<= 0`` and ``beta`` in ``[0, 1]``
    (only finite, where an activation takes them raw), the pool slots distinct and in range. The
    CPU path runs them first; on CUDA the GPU runs them (``kernels.decode.value_checks``) and these
    run only to name what it flagged."""
    B, T, HV = beta.shape
    DK = g.shape[3] if g.dim() == 4 else 1
    act = check_activation(g, beta, check_values=True, **options)        # raw values: finite
    if act.gate is None:
        validate.check_gates(g, B, T, HV, DK, g.device)
    if act.beta is None:
        validate.check_beta(beta, B, T, HV, g.device)
    if indices is not None and indices.dim() == 1:     # the token slots (2-D) are checked apart
        check_state_pool(pool, indices, N, HV, pool.shape[2], pool.shape[3], g.device, check_values=True)


def recurrent_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens, ssm_state_indices, per_channel, check_values, cu_seqlens_cpu, options=None,
                    num_accepted_tokens=None):
    """Both public functions: checks, then the kernel (CUDA), the float64 recurrence (CPU) or, under
    ``torch.compile``, an op of ``kda.custom_ops``. ``options``: fla's activation arguments;
    ``num_accepted_tokens`` and a 2-D ``ssm_state_indices``: speculative decoding (the module's text)."""
    options = {name: (options or {}).get(name) for name in (
        "A_log", "dt_bias", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "lower_bound",
        "state_v_first")}
    pooled = ssm_state_indices is not None
    compiling = torch.compiler.is_compiling()             # the checks a graph can hold, then the op
    cuda = validate.runs_kernels(q)
    # a CUDA graph: no reads (dynamo cannot trace the capture query, and compiling skips the reads anyway)
    capturing = cuda and not compiling and torch.cuda.is_current_stream_capturing()
    check_values = check_values and not compiling and not capturing
    if cuda and not compiling and not capturing and _pending_checks:
        raise_pending_checks()                            # an earlier step's deferred checks, before anything
    scale, h0, bounds = validate.check_gated_delta_inputs(
        q, k, v, g, beta, scale, None if pooled else initial_state, cu_seqlens, per_channel, check_values=False,
        cu_seqlens_cpu=cu_seqlens_cpu, read_bounds=not compiling and not capturing)
    B, HV, DK, DV = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
    act = check_activation(g, beta, check_values=False, **options)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    token_slots = pooled and isinstance(ssm_state_indices, torch.Tensor) and ssm_state_indices.dim() == 2
    if num_accepted_tokens is not None and not token_slots:
        raise ValueError("num_accepted_tokens needs ssm_state_indices [N, T_max]: a pool slot for the state after "
                         "each token, from which the next step resumes")
    if token_slots and compiling:
        raise NotImplementedError("speculative decoding (ssm_state_indices [N, T_max]) does not run under "
                                  "torch.compile yet: call it eagerly")
    if pooled:
        if initial_state is None:
            raise ValueError("ssm_state_indices needs initial_state: the state pool the indices point into")
        if token_slots:                                   # the sequences' lengths where the host has them
            lengths = [q.shape[1]] * N if cu_seqlens is None else \
                None if bounds is None else [e - s for s, e in zip(bounds, bounds[1:])]
            check_token_slots(initial_state, ssm_state_indices, num_accepted_tokens, lengths, N, HV, DK, DV,
                              q.device, check_values)
        else:
            check_state_pool(initial_state, ssm_state_indices, N, HV, DK, DV, q.device, check_values=False)
    if check_values and not cuda:
        check_values_on_host(g, beta, options, initial_state, ssm_state_indices, N)
    # on CUDA the GPU checks the values (no wait before the kernel); the host names what it flagged
    recheck = (lambda flags: _raise_flagged(flags, g, beta, options, initial_state, ssm_state_indices, N)) \
        if check_values and cuda else None
    if compiling:                                         # the activations in torch, then the op
        g, beta = act.apply(g, beta)
        g, beta = g.float(), beta.float()
        if pooled:
            o = torch.ops.kda.fused_recurrent_pooled(q, k, v, g, beta, scale, initial_state, ssm_state_indices,
                                                     use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu)
            return o, (initial_state if output_final_state else None)
        o, final = torch.ops.kda.fused_recurrent(q, k, v, g, beta, scale, h0, output_final_state,
                                                 use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu)
        return o, (final if output_final_state else None)
    if cuda:
        from kda.kernels.decode import run_fused_recurrent

        if token_slots:
            from kda import cuda_paths

            cuda_paths.require(cuda_paths.by_name("token_slots_decode"),
                               "speculative decoding (ssm_state_indices [N, T_max]) on CUDA")
        q, k, g = kernel_inputs(q, k, g, use_qk_l2norm_in_kernel)
        defer = _pending_checks.append if DEFERRED_CHECKS and recheck is not None else None
        o, final = run_fused_recurrent(q, k, v, g, beta, scale, initial_state if pooled else h0, cu_seqlens,
                                       ssm_state_indices, output_final_state, act, recheck, num_accepted_tokens,
                                       defer)
    else:
        g, beta = act.apply(g, beta)
        if check_values and not use_qk_l2norm_in_kernel:  # the keys against the delta rule's bound, beta activated
            validate.check_key_norms(k, beta)
        o, final = _run_reference(q, k, v, g, beta, scale, initial_state if pooled else h0, bounds,
                                  ssm_state_indices, output_final_state, use_qk_l2norm_in_kernel, num_accepted_tokens)
    return o, (final if output_final_state else None)


def _raise_flagged(flags, g, beta, options, pool, indices, N) -> None:
    """After ``value_checks`` flagged a value (``flags`` on the host): the host checks' error, which
    names the value. The guarded kernel has written nothing, so a pool is as it was."""
    if any(flags.tolist()):
        check_values_on_host(g, beta, options, pool, indices, N)
        raise ValueError(f"a value of g, beta or ssm_state_indices is out of range: the GPU check flagged "
                         f"{flags.tolist()} (gate, beta, slots)")


def _run_reference(q, k, v, g, beta, scale, h0, bounds, indices, output_final_state, l2norm, accepted=None):
    """The float64 recurrence, sequence by sequence; a pool is updated in place (with token slots, the state
    after every token to its slot, the recurrence going on from the float64 state)."""
    if l2norm:
        q, k = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    q, k = repeat_to_value_heads(q.double() * scale, k.double(), v.shape[2])
    spans = [(n, 0, q.shape[1]) for n in range(q.shape[0])] if bounds is None else \
        [(0, s, e) for s, e in zip(bounds, bounds[1:])]
    slots = indices.tolist() if indices is not None else None
    o = torch.empty(v.shape, dtype=torch.float64)
    if slots is not None and indices.dim() == 2:        # token slots: every token's state kept
        starts = accepted.tolist() if accepted is not None else [1] * len(spans)
        states = [h0[slots[n][starts[n] - 1]].double()[None] for n in range(len(spans))]  # read before any write
        for n, (b, s, e) in enumerate(spans):
            state = states[n]
            for t in range(e - s):
                rows = slice(s + t, s + t + 1)
                o[b:b + 1, rows], state = ref0.recurrent(q[b:b + 1, rows], k[b:b + 1, rows], v[b:b + 1, rows],
                                                         g[b:b + 1, rows], beta[b:b + 1, rows], state, True)
                h0[slots[n][t]] = state[0].float()
        return o.to(v.dtype), h0
    finals = []
    for n, (b, s, e) in enumerate(spans):
        start = None if h0 is None else h0[slots[n] if slots is not None else n][None]
        o_n, f_n = ref0.recurrent(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], g[b:b + 1, s:e],
                                  beta[b:b + 1, s:e], start, True)
        o[b:b + 1, s:e] = o_n
        finals.append(f_n[0].float())
    if slots is not None:
        for slot, f in zip(slots, finals):
            h0[slot] = f
        return o.to(v.dtype), h0
    return o.to(v.dtype), torch.stack(finals)


# --8<-- [start:fused_recurrent_kda]
def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, ssm_state_indices=None, check_values=True,
                        cu_seqlens_cpu=None, num_accepted_tokens=None):
    """KDA decode, with fla 0.6.0's ``fused_recurrent_kda`` arguments in its order:

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``, ``HV`` a multiple of ``H`` (grouped value heads).
        g: ``[B, T, HV, K]``, the per-channel log decay (``<= 0``, finite), or with ``use_gate_in_kernel``
            the raw gate (finite) that the kernel turns into one.
        beta: ``[B, T, HV]`` in ``[0, 1]``, or with ``use_beta_sigmoid_in_kernel`` raw logits.
        A_log, dt_bias: ``[HV]`` and ``[HV * K]``: with ``use_gate_in_kernel`` the log decay is
            ``-exp(A_log) softplus(g + dt_bias)``, or with ``lower_bound`` (``< 0``)
            ``lower_bound sigmoid(exp(A_log) (g + dt_bias))`` (``A_log`` may then be ``None``).
        scale: multiplies ``q``; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]``, or with ``ssm_state_indices`` the state pool ``[P, HV, K, V]``
            (float32, contiguous), updated in place.
        output_final_state: also return the float32 final states (the pool itself when pooled).
        use_qk_l2norm_in_kernel: L2-normalize ``q`` and ``k`` first.
        use_beta_sigmoid_in_kernel: ``beta <- sigmoid(beta)``; with ``allow_neg_eigval`` ``2 sigmoid(beta)``.
        state_v_first: not supported (raises).
        cu_seqlens: ``[N + 1]`` boundaries of sequences packed along ``T`` (then ``B = 1``).
        ssm_state_indices: ``[N]`` pool slot of each sequence (continuous batching), or ``[N, T_max]`` a slot
            for the state after each token (speculative decoding; slots past a sequence's length unused).
        num_accepted_tokens: ``[N]`` (in ``[1, T_max]``, with ``ssm_state_indices [N, T_max]``): sequence ``n``
            starts from slot ``ssm_state_indices[n, num_accepted_tokens[n] - 1]``, the state after the last
            token the previous step kept.
        check_values: check ``g``, ``beta`` and the slots (on CUDA by a kernel before the step's,
            which then writes nothing if one is bad, and a read-back of its flags; skipped during
            CUDA graph capture and under ``torch.compile``). Token slots (``[N, T_max]``) are read back
            and checked on the host.
        cu_seqlens_cpu: a host copy of ``cu_seqlens``, trusted to equal it.

    Returns:
        ``(o, final_state)``: ``o [B, T, HV, V]`` in the dtype of ``v``; ``final_state`` or ``None``.
    """
    options = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                   lower_bound=lower_bound, state_v_first=state_v_first)
    return recurrent_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                           cu_seqlens, ssm_state_indices, True, check_values, cu_seqlens_cpu, options,
                           num_accepted_tokens)
# --8<-- [end:fused_recurrent_kda]


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, ssm_state_indices=None, check_values=True, cu_seqlens_cpu=None,
                                     lower_bound=None, num_accepted_tokens=None):
    """GDN decode, with fla 0.6.0's ``fused_recurrent_gated_delta_rule`` arguments in its order: the
    gate ``g [B, T, HV]`` (one per head) or ``gk [B, T, HV, K]`` (per key channel; then this is
    ``fused_recurrent_kda``), or neither (no decay); ``beta`` defaults to ones. With
    ``use_gate_in_kernel`` ``A_log`` and ``dt_bias`` are ``[HV]`` for ``g`` (``[HV * K]`` for ``gk``).
    ``gv`` (a gate on the value channels) is not supported. Other arguments (``num_accepted_tokens`` and token
    slots for speculative decoding among them) and the result as in ``fused_recurrent_kda``."""
    if gv is not None:
        raise ValueError("gv (a gate per value channel) is not supported; pass g (per head) or gk (per key channel)")
    if g is not None and gk is not None:
        raise ValueError("pass one gate: g [B, T, HV] (per head) or gk [B, T, HV, K] (per key channel), not both")
    B, T, HV = (v.shape[:3] if isinstance(v, torch.Tensor) and v.dim() == 4 else (None,) * 3)
    if g is None and gk is None and B is not None:
        g = torch.zeros(B, T, HV, device=v.device)
    if beta is None and B is not None:
        beta = torch.ones(B, T, HV, device=v.device)
    options = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                   lower_bound=lower_bound, state_v_first=state_v_first)
    return recurrent_eager(q, k, v, g if gk is None else gk, beta, scale, initial_state, output_final_state,
                           use_qk_l2norm_in_kernel, cu_seqlens, ssm_state_indices, gk is not None, check_values,
                           cu_seqlens_cpu, options, num_accepted_tokens)
