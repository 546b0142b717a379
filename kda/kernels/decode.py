"""The gated delta rule one token at a time (decode): ``fused_recurrent``.

Per token, with the state ``S [DK, DV]`` in registers (fla's convention, ``d_k x d_v``)::

    S <- diag(exp g_t) S;   S <- S + b_t k_t (v_t - S^T k_t)^T;   o_t = scale S^T q_t

A decode step reads and writes every state once and does ``O(DK DV)`` work per token, so the
kernel is a stream over the states: one block per (value stripe, value head, sequence), the
stripe's ``[DK, block_dv]`` slice of the state loaded once, every token of the sequence applied
to it in registers, the slice stored once. The two matrix-vector products are reductions over
the key channels (``T.reduce_sum`` over the rows of the fragment). Mirrors
``kda.reference.level0.recurrent``.

Compile-time flags, one factory: ``scalar_gate`` (GDN: ``g [.., 1]``), ``value_groups`` (value
heads per query/key head), ``varlen`` (sequences packed along ``T`` by ``cu_seqlens``),
``with_initial`` / ``store_final``, and ``pooled``: the states live in a pool ``[P, HV, DK, DV]``
and sequence ``n`` reads and writes slot ``indices[n]`` in place (continuous batching; fla's
``ssm_state_indices``).
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import functools

import tilelang.language as T
import torch

from kda import launch, validate
from kda.activation import NO_ACTIVATION
from kda.kernels.stages import ACCUM, FLOAT32_MAX, LOG2_E, real


# --8<-- [start:fused_recurrent]
def fused_recurrent(DK, DV, block_dv=32, dtype="bfloat16", gate_dtype="float32", scalar_gate=False,
                    value_groups=1, varlen=False, with_initial=True, store_final=True, pooled=False,
                    gate_act=None, beta_act=None, guarded=False, token_slots=False, accepted=False, threads=128):
    """Arguments at run time: ``Q, K [B, T, HQ, DK]``, ``V [B, T, HV, DV]``, ``g [B, T, HV, DK or 1]``
    (natural log, ``<= 0``), ``beta [B, T, HV]`` (float32), ``scale``, ``A_log [HV]``, ``dt_bias
    [HV, DK or 1]`` (float32), ``lower_bound``, ``O [B, T, HV, DV]``; then
    ``h0``, ``ht`` (float32 ``[N, HV, DK, DV]``, one state per sequence; with ``pooled`` the pool
    ``[P, HV, DK, DV]``, passed twice; a ``[1, HV, DK, DV]`` stand-in where ``with_initial`` or
    ``store_final`` is off), ``cu_seqlens [N + 1]`` (int32) with ``varlen``, ``indices [N]`` (int32)
    with ``pooled``; each of the last two a ``[1]`` stand-in in the forms without it; ``flags [3]``
    (int32, ``value_checks``' verdict) with ``guarded``: a block then writes nothing, neither ``O``
    nor a state, if any flag is set, so that a step with a bad value leaves a pool as it was.
    ``token_slots`` (with ``pooled``; speculative decoding): ``indices [N, TI]``, the state after token ``t`` of
    sequence ``n`` stored to slot ``indices[n, t]`` (a stripe per token, nothing at the end), the start read from
    ``indices[n, 0]``, or with ``accepted`` from ``indices[n, accepted[n] - 1]``: ``accepted [N]`` (int32) after
    ``indices`` (a ``[1]`` stand-in otherwise). A block reads its start before it writes a slot; the caller
    checks that no other sequence writes it."""
    assert gate_act in (None, "softplus", "sigmoid") and beta_act in (None, "sigmoid", "2sigmoid")
    B, S, HQ, HV = T.dynamic("B"), T.dynamic("T"), T.dynamic("HQ"), T.dynamic("HV")
    N = T.dynamic("N")
    R0, R1 = T.dynamic("R0"), T.dynamic("R1")   # rows of h0 and ht: N, the pool's P, or 1 for a stand-in
    BV = block_dv
    GD = 1 if scalar_gate else DK
    NV = T.ceildiv(DV, BV)
    assert DV % BV == 0, "the value stripes must tile DV"
    assert not pooled or (with_initial and store_final), "a pool is read and written in place"
    assert pooled or not token_slots, "token slots are slots of a pool"
    assert token_slots or not accepted, "the accepted tokens index the token slots"
    TI = T.dynamic("TI")

    def gate(x, A_log, dt_bias, lower_bound, hv, i):
        """The log decay from the gate as given: as is, or fla's activations of a raw gate,
        ``-exp(A_log) softplus(x + dt_bias)`` or ``lower_bound sigmoid(exp(A_log) (x + dt_bias))``."""
        if gate_act is None:
            return x
        x = x + dt_bias[hv, i]
        if gate_act == "softplus":                       # torch's softplus: linear above 20
            return -T.exp(A_log[hv]) * T.if_then_else(x > 20.0, x, T.log(1.0 + T.exp(T.min(x, 20.0))))
        return lower_bound / (1.0 + T.exp(-T.exp(A_log[hv]) * x))

    def step_size(b):
        """``beta`` as given, or ``sigmoid(beta)`` (times 2 where negative eigenvalues are allowed)."""
        if beta_act is None:
            return b
        return (2.0 if beta_act == "2sigmoid" else 1.0) / (1.0 + T.exp(-b))

    @T.macro
    def body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, bb, t_first, t_end, slot,
             token_slot):
        hq = hv // value_groups if value_groups > 1 else hv
        dv0 = bv * BV
        S_f = T.alloc_fragment([DK, BV], ACCUM)         # the state's stripe, in registers
        prod = T.alloc_fragment([DK, BV], ACCUM)
        col = T.alloc_fragment([BV], ACCUM)             # S^T k, then S^T q
        q_s = T.alloc_shared([DK], ACCUM)
        k_s = T.alloc_shared([DK], ACCUM)
        decay_s = T.alloc_shared([GD], ACCUM)
        r_s = T.alloc_shared([BV], ACCUM)               # b (v - S^T k)
        if with_initial:
            T.copy(h0[slot, hv, :, dv0:dv0 + BV], S_f)
        else:
            T.clear(S_f)
        for t in T.serial(t_end - t_first):
            tok = t_first + t
            for i in T.Parallel(DK):
                q_s[i] = T.Cast(ACCUM, Q[bb, tok, hq, i])
                k_s[i] = T.Cast(ACCUM, K[bb, tok, hq, i])
            for i in T.Parallel(GD):
                decay_s[i] = T.exp2(gate(T.Cast(ACCUM, g[bb, tok, hv, i]), A_log, dt_bias, lower_bound, hv, i) * LOG2_E)
            for i, j in T.Parallel(DK, BV):                 # S <- diag(exp g) S
                S_f[i, j] = S_f[i, j] * decay_s[i if GD > 1 else 0]
            for i, j in T.Parallel(DK, BV):
                prod[i, j] = S_f[i, j] * k_s[i]
            T.reduce_sum(prod, col, dim=0)                   # S^T k
            for j in T.Parallel(BV):
                r_s[j] = (T.Cast(ACCUM, V[bb, tok, hv, dv0 + j]) - col[j]) * step_size(beta[bb, tok, hv])
            for i, j in T.Parallel(DK, BV):                 # S <- S + k (b (v - S^T k))^T
                S_f[i, j] = S_f[i, j] + k_s[i] * r_s[j]
            for i, j in T.Parallel(DK, BV):
                prod[i, j] = S_f[i, j] * q_s[i]
            T.reduce_sum(prod, col, dim=0)                   # S^T q
            for j in T.Parallel(BV):
                O[bb, tok, hv, dv0 + j] = T.Cast(dtype, col[j] * scale)
            if token_slots:                                  # the state after every token, to its own slot
                T.copy(S_f, ht[token_slot(t), hv, :, dv0:dv0 + BV])
        if store_final and not token_slots:
            T.copy(S_f, ht[slot, hv, :, dv0:dv0 + BV])

    # the four launch forms (dense or packed, states per sequence or in a pool) share one signature:
    # the table a form does not use is a [1] stand-in, never read
    BB = 1 if varlen else B                     # batch rows of the tensors
    NS = N if varlen else B                     # sequences, one block row each

    @T.prim_func
    def main(
        Q: T.Tensor([BB, S, HQ, DK], dtype),
        K: T.Tensor([BB, S, HQ, DK], dtype),
        V: T.Tensor([BB, S, HV, DV], dtype),
        g: T.Tensor([BB, S, HV, GD], gate_dtype),
        beta: T.Tensor([BB, S, HV], ACCUM),
        scale: T.float32,
        A_log: T.Tensor([HV], ACCUM),
        dt_bias: T.Tensor([HV, GD], ACCUM),
        lower_bound: T.float32,
        O: T.Tensor([BB, S, HV, DV], dtype),
        h0: T.Tensor([R0, HV, DK, DV], ACCUM),
        ht: T.Tensor([R1, HV, DK, DV], ACCUM),
        cu_seqlens: T.Tensor([N + 1] if varlen else [1], "int32"),
        indices: T.Tensor(([NS, TI] if token_slots else [NS]) if pooled else [1], "int32"),
        accepted_tokens: T.Tensor([NS] if accepted else [1], "int32"),
        flags: T.Tensor([3] if guarded else [1], "int32"),
    ):
        with T.Kernel(NV, HV, NS, threads=threads) as (bv, hv, n):
            if token_slots:
                slot = indices[n, accepted_tokens[n] - 1] if accepted else indices[n, 0]
            else:
                slot = indices[n] if pooled else n
            token_slot = lambda t: indices[n, t]
            clean = (flags[0] + flags[1] + flags[2] == 0) if guarded else True
            if clean:
                if varlen:
                    body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, 0, cu_seqlens[n],
                         cu_seqlens[n + 1], slot, token_slot)
                else:
                    body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, n, 0, S, slot,
                         token_slot)

    return main
# --8<-- [end:fused_recurrent]


# --8<-- [start:value_checks]
def value_checks(gate_dtype="float32", gate_finite_only=False, beta_finite_only=False, pooled=False,
                 index_dtype="int32", per_thread=8, threads=128):
    """The checks of a decode step's values, on the GPU, for ``fused_recurrent(guarded=True)`` to
    read: ``flags[0] = 1`` if a gate is not (finite and ``<= 0``) (only not finite, for a raw gate
    that an activation turns into one), ``flags[1] = 1`` if a ``beta`` is outside ``[0, 1]`` (not
    finite, for raw logits), ``flags[2] = 1`` with ``pooled`` if a slot is outside ``[0, P)`` or taken
    twice. Arguments at run time: ``g [E]`` (every gate, flat), ``beta [R]`` (float32, flat),
    ``indices [N]`` (``index_dtype``, as the caller gave them; a ``[1]`` stand-in without
    ``pooled``), ``P`` (the pool's slots), then ``flags [3]``, zeroed by the caller. A block checks
    ``threads * per_thread`` values, coalesced; a slot is compared with every other one (``N`` is a
    decode batch)."""
    E, R, N = T.dynamic("E"), T.dynamic("R"), T.dynamic("N")
    span = threads * per_thread
    NG, NB = T.ceildiv(E, span), T.ceildiv(R, span)
    NI = T.ceildiv(N, threads) if pooled else 0

    def out_of_range(x, finite_only, lo, hi):
        """``x`` outside ``[lo, hi]``, or not finite; NaN fails every comparison."""
        if finite_only:
            lo, hi = -FLOAT32_MAX, FLOAT32_MAX
        return real(x >= lo) * real(x <= hi) == 0.0

    @T.prim_func
    def main(
        g: T.Tensor([E], gate_dtype),
        beta: T.Tensor([R], "float32"),
        indices: T.Tensor([N] if pooled else [1], index_dtype),
        P: T.int32,
        flags: T.Tensor([3], "int32"),
    ):
        with T.Kernel(NG + NB + NI, threads=threads) as bx:
            tx = T.get_thread_binding()
            if bx < NG:
                for u in T.serial(per_thread):
                    e = (bx * per_thread + u) * threads + tx
                    if e < E:
                        if out_of_range(T.Cast(ACCUM, g[e]), gate_finite_only, -FLOAT32_MAX, 0.0):
                            flags[0] = 1
            if bx >= NG and bx < NG + NB:
                for u in T.serial(per_thread):
                    r = ((bx - NG) * per_thread + u) * threads + tx
                    if r < R:
                        if out_of_range(beta[r], beta_finite_only, 0.0, 1.0):
                            flags[1] = 1
            if pooled:
                if bx >= NG + NB:
                    m = (bx - NG - NB) * threads + tx
                    if m < N:
                        slot = indices[m]
                        if real(slot >= 0) * real(slot < T.Cast(index_dtype, P)) == 0.0:
                            flags[2] = 1
                        for j in T.serial(N):             # every thread reads the same j: one broadcast
                            if real(j != m) * real(indices[j] == slot) > 0.0:
                                flags[2] = 1

    return main
# --8<-- [end:value_checks]


# ---- the launcher ----

BLOCK_DV = 32       # value columns per block: B * HV * DV / 32 blocks, 32 state registers per thread


@functools.lru_cache(maxsize=32)
def _zeros(shape: tuple, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """Zeros made once per shape, device and dtype, never written: the ``A_log`` and ``dt_bias`` the
    kernel takes where none are given (a fill kernel per decode step cost a launch each), the
    ``[1, HV, DK, DV]`` state stand-ins of a kernel compiled without an initial or final state, and
    the clear flags of an unchecked step."""
    return torch.zeros(shape, dtype=dtype, device=device)


# --8<-- [start:run_fused_recurrent]
# CUDA: speculative decoding's token slots (ssm_state_indices [N, T_max], num_accepted_tokens): the state after every
# token stored to its slot, the start read from the accepted token's (fused_recurrent's token_slots). Its GPU tests
# passed in run 111 (H100: KDA and GDN, dense and packed, against the float64 token recurrence): on.
TOKEN_SLOTS = True


def run_fused_recurrent(q, k, v, g, beta, scale, h0, cu_seqlens, indices, output_final_state, act=NO_ACTIVATION,
                        check=None, accepted=None, defer=None):
    """One launch of ``fused_recurrent`` for every sequence (``g [B, T, HV, K or 1]``, contiguous: as
    ``kda.gated_delta.kernel_inputs`` makes it). With ``check(flags)``: ``value_checks``
    first, the kernel guarded by its flags (nothing written if one is set), and the flags read once
    the kernel is queued (``validate.launch_then_check``): the host waits for the checks only.
    Without: the same kernel reads flags that are always clear (cached zeros), and nothing here
    reads the device or copies from the host, so that a CUDA graph can capture it after a first
    call, checked or not, has compiled the kernel. ``indices [N, T_max]`` (and ``accepted [N]``): speculative
    decoding's token slots, which the caller has checked (the GPU checks ``g`` and ``beta`` only). ``defer``
    (with ``check``; ``kda.decode.DEFERRED_CHECKS``): ``validate.launch_then_check``'s, so that the host does not
    wait."""
    from kda.kernels.build import compile_program

    B, T, HV, DV = v.shape
    DK = q.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    pooled = indices is not None
    token_slots = pooled and indices.dim() == 2
    with torch.cuda.device(q.device):
        kernel = compile_program(fused_recurrent, (), DK=DK, DV=DV, block_dv=BLOCK_DV,
                                 dtype=launch.dtype_name(q.dtype), gate_dtype=str(g.dtype).removeprefix("torch."),
                                 scalar_gate=g.shape[-1] == 1, value_groups=HV // q.shape[2],
                                 varlen=cu_seqlens is not None, with_initial=h0 is not None,
                                 store_final=pooled or output_final_state, pooled=pooled,
                                 gate_act=act.gate, beta_act=act.beta, guarded=True,
                                 **(dict(token_slots=True, accepted=accepted is not None) if token_slots else {}))
        GD = g.shape[-1]
        A_log = act.A_log if act.A_log is not None else _zeros((HV,), q.device)
        dt_bias = act.dt_bias if act.dt_bias is not None else _zeros((HV, GD), q.device)
        stand_in = _zeros((1, HV, DK, DV), q.device)      # never read or written by such a kernel
        if pooled:
            h0_arg = ht = h0
        else:
            h0_arg = h0.to(torch.float32).contiguous() if h0 is not None else stand_in
            ht = launch.new_output((N, HV, DK, DV), torch.float32, q.device) if output_final_state else stand_in
        o = launch.new_output(v.shape, v.dtype, q.device)
        no_table = launch.stand_in(1, torch.int32, q.device)  # for a table the launch form has not
        bounds = cu_seqlens.to(device=q.device, dtype=torch.int32) if cu_seqlens is not None else no_table
        slots = indices.to(torch.int32).contiguous() if pooled else no_table
        starts = accepted.to(torch.int32) if accepted is not None else no_table
        beta = beta.to(torch.float32).contiguous()
        flags = _zeros((3,), q.device, torch.int32)       # clear: an unchecked step
        if check is not None:
            flags = torch.zeros(3, dtype=torch.int32, device=q.device)
            # the slots as given: an int64 slot of 2^32 or more would pass as int32 (it wraps)
            slot_checks = pooled and not token_slots                   # token slots: the caller checked them
            given = indices if slot_checks else no_table
            checks = compile_program(value_checks, (), gate_dtype=str(g.dtype).removeprefix("torch."),
                                     gate_finite_only=act.gate is not None, beta_finite_only=act.beta is not None,
                                     pooled=slot_checks, index_dtype=str(given.dtype).removeprefix("torch."))
            checks(g.view(-1), beta.view(-1), given, h0.shape[0] if pooled else 0, flags)
        args = (q.contiguous(), k.contiguous(), v.contiguous(), g, beta, scale, A_log, dt_bias, act.lower_bound, o,
                h0_arg, ht, bounds, slots, starts, flags)
        validate.launch_then_check(flags, lambda: kernel(*args), check, defer)
    return o, ht
# --8<-- [end:run_fused_recurrent]
