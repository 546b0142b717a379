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
import tilelang.language as T

from kda.kernels.stages import ACCUM, LOG2_E


# --8<-- [start:fused_recurrent]
def fused_recurrent(DK, DV, block_dv=32, dtype="bfloat16", gate_dtype="float32", scalar_gate=False,
                    value_groups=1, varlen=False, with_initial=True, store_final=True, pooled=False,
                    gate_act=None, beta_act=None, threads=128):
    """Arguments at run time: ``Q, K [B, T, HQ, DK]``, ``V [B, T, HV, DV]``, ``g [B, T, HV, DK or 1]``
    (natural log, ``<= 0``), ``beta [B, T, HV]`` (float32), ``scale``, ``A_log [HV]``, ``dt_bias
    [HV, DK or 1]`` (float32), ``lower_bound``, ``O [B, T, HV, DV]``; then
    ``h0``, ``ht`` (float32 ``[N, HV, DK, DV]``, one state per sequence; with ``pooled`` the pool
    ``[P, HV, DK, DV]``, passed twice; a ``[1, HV, DK, DV]`` stand-in where ``with_initial`` or
    ``store_final`` is off), ``cu_seqlens [N + 1]`` (int32) with ``varlen``, ``indices [N]`` (int32)
    with ``pooled``; each of the last two a ``[1]`` stand-in in the forms without it."""
    assert gate_act in (None, "softplus", "sigmoid") and beta_act in (None, "sigmoid", "2sigmoid")
    B, S, HQ, HV = T.dynamic("B"), T.dynamic("T"), T.dynamic("HQ"), T.dynamic("HV")
    N = T.dynamic("N")
    R0, R1 = T.dynamic("R0"), T.dynamic("R1")   # rows of h0 and ht: N, the pool's P, or 1 for a stand-in
    BV = block_dv
    GD = 1 if scalar_gate else DK
    NV = T.ceildiv(DV, BV)
    assert DV % BV == 0, "the value stripes must tile DV"
    assert not pooled or (with_initial and store_final), "a pool is read and written in place"

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
    def body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, bb, t_first, t_end, slot):
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
        if store_final:
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
        indices: T.Tensor([NS] if pooled else [1], "int32"),
    ):
        with T.Kernel(NV, HV, NS, threads=threads) as (bv, hv, n):
            slot = indices[n] if pooled else n
            if varlen:
                body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, 0, cu_seqlens[n],
                     cu_seqlens[n + 1], slot)
            else:
                body(Q, K, V, g, beta, scale, A_log, dt_bias, lower_bound, O, h0, ht, bv, hv, n, 0, S, slot)

    return main
# --8<-- [end:fused_recurrent]
