"""Decode (kda.fused_recurrent_kda, kda.fused_recurrent_gated_delta_rule) on the CPU: token by
token it is the chunked forward and the float64 recurrence; grouped value heads, packed
sequences, the state pool updated in place; clear errors."""

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

import random_inputs

B, T, H, DK, DV = 2, 37, 2, 16, 8


def inputs(B=B, T=T, H=H, HV=H, seed=0, per_channel=True):
    drawn = random_inputs.gated_delta(B, T, HV, DK, DV, HQ=H, gate="channel" if per_channel else "head", seed=seed)
    return drawn[:6]


def test_token_by_token_is_the_chunked_forward_and_the_recurrence():
    q, k, v, g, beta, h0 = inputs()
    o, ht = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_ht = ref0.recurrent(q * DK ** -0.5, k, v, g, beta, h0, True)
    assert rel_l2(o, ref_o) < 1e-12 and rel_l2(ht, ref_ht) < 1e-6          # the final state is float32
    chunk_o, chunk_ht = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_l2(o, chunk_o) < 1e-12 and rel_l2(ht, chunk_ht) < 1e-6
    state, steps = h0.float(), []                                           # one token per call
    for t in range(T):
        sl = slice(t, t + 1)
        o_t, state = kda.fused_recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                                             initial_state=state, output_final_state=True)
        steps.append(o_t)
    assert rel_l2(torch.cat(steps, dim=1), ref_o) < 1e-6 and rel_l2(state, ref_ht) < 1e-6


def test_gdn_gates_per_head_per_channel_and_none():
    q, k, v, g, beta, h0 = inputs(per_channel=False)
    o, _ = kda.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0)
    ref_o, _ = ref0.recurrent(q * DK ** -0.5, k, v, g, beta, h0)
    assert rel_l2(o, ref_o) < 1e-12
    wide = g[..., None].expand(*g.shape, DK)
    o_gk, _ = kda.fused_recurrent_gated_delta_rule(q, k, v, gk=wide, beta=beta, initial_state=h0)
    assert rel_l2(o_gk, ref_o) < 1e-12
    o_none, _ = kda.fused_recurrent_gated_delta_rule(q, k, v)                # no decay, beta = 1
    ref_none, _ = ref0.recurrent(q * DK ** -0.5, k, v, torch.zeros(B, T, H), torch.ones(B, T, H))
    assert rel_l2(o_none, ref_none) < 1e-12


def test_grouped_value_heads_read_their_query_head():
    q, k, v, g, beta, h0 = inputs(HV=2 * H)
    o, ht = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    rep = lambda x: x.repeat_interleave(2, dim=2)
    ref_o, ref_ht = ref0.recurrent(rep(q) * DK ** -0.5, rep(k), v, g, beta, h0, True)
    assert rel_l2(o, ref_o) < 1e-12 and rel_l2(ht, ref_ht) < 1e-6


def test_packed_sequences_with_an_empty_one():
    q, k, v, g, beta, _ = inputs(B=1)
    bounds = [0, 5, 5, 6, T]
    h0 = torch.randn(4, H, DK, DV, dtype=torch.float64)
    o, ht = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                    cu_seqlens=torch.tensor(bounds))
    for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
        ref_o, ref_ht = ref0.recurrent(q[:, s:e] * DK ** -0.5, k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                       h0[n:n + 1], True)
        assert rel_l2(o[:, s:e], ref_o) < 1e-12 if e > s else True
        assert rel_l2(ht[n:n + 1], ref_ht) < 1e-6


def test_the_state_pool_is_updated_in_place_at_the_indices():
    q, k, v, g, beta, _ = inputs(B=3, T=2)
    pool = torch.randn(5, H, DK, DV)
    before = pool.clone()
    slots = torch.tensor([4, 0, 2])
    o, final = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots,
                                       output_final_state=True)
    assert final is pool
    for n, slot in enumerate(slots.tolist()):
        ref_o, ref_ht = ref0.recurrent(q[n:n + 1] * DK ** -0.5, k[n:n + 1], v[n:n + 1], g[n:n + 1],
                                       beta[n:n + 1], before[slot][None], True)
        assert rel_l2(o[n:n + 1], ref_o) < 1e-6 and rel_l2(pool[slot][None], ref_ht) < 1e-6
    assert torch.equal(pool[[1, 3]], before[[1, 3]])                      # other slots untouched


@pytest.mark.parametrize("kwargs,message", [
    (dict(ssm_state_indices=torch.tensor([0, 0])), "distinct slots"),
    (dict(ssm_state_indices=torch.tensor([0, 9])), r"distinct slots in \[0, 3\)"),
    (dict(ssm_state_indices=torch.tensor([0])), r"ssm_state_indices must be an integer tensor \[N\] = \[2\]"),
    (dict(ssm_state_indices=torch.tensor([0.0, 1.0])), "integer tensor"),
])
def test_bad_pool_indices_raise(kwargs, message):
    q, k, v, g, beta, _ = inputs()
    with pytest.raises(ValueError, match=message):
        kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=torch.zeros(3, H, DK, DV), **kwargs)


def speculative_step(per_channel, lengths, accepted, TI=4, P=24, seed=3):
    """A verify step of packed sequences (``lengths`` tokens each) with token slots ``[N, TI]`` (each sequence
    its own ``TI`` slots; -1 past its length, as vLLM pads) and ``accepted``: the call's outputs and pool, the
    pool before, the slot table and the inputs."""
    N = len(lengths)
    q, k, v, g, beta, _ = inputs(B=1, T=sum(lengths), seed=seed, per_channel=per_channel)
    pool = torch.randn(P, H, DK, DV)
    before = pool.clone()
    slots = torch.arange(N * TI).reshape(N, TI)
    for n, L in enumerate(lengths):                      # unused slots past a sequence's length
        slots[n, max(L, accepted[n]):] = -1
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    call = kda.fused_recurrent_kda if per_channel else \
        (lambda q, k, v, g, beta, **kw: kda.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw))
    o, final = call(q, k, v, g, beta, initial_state=pool, output_final_state=True, cu_seqlens=cu,
                    ssm_state_indices=slots, num_accepted_tokens=torch.tensor(accepted))
    return o, final, pool, before, slots, cu, (q, k, v, g, beta)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_speculative_decoding_keeps_every_tokens_state(per_channel):
    """Token slots ``[N, T_max]`` and ``num_accepted_tokens`` (fla's meaning): sequence ``n`` starts from slot
    ``[n, accepted - 1]`` of the pool as it was, the state after its token ``t`` lands in slot ``[n, t]``, each
    output and state equal to the float64 recurrence token by token; slots no token writes keep their values,
    the pool is the final state returned. Lengths 0 to 4, accepted 1 to 4."""
    lengths, accepted = [3, 0, 1, 4, 2], [2, 1, 4, 1, 3]
    o, final, pool, before, slots, cu, (q, k, v, g, beta) = speculative_step(per_channel, lengths, accepted)
    assert final is pool
    written = set()
    for n, L in enumerate(lengths):
        s = cu[n].item()
        state = before[slots[n, accepted[n] - 1]][None]
        for t in range(L):
            rows = slice(s + t, s + t + 1)
            ref_o, state = ref0.recurrent(q[:, rows] * DK ** -0.5, k[:, rows], v[:, rows], g[:, rows], beta[:, rows],
                                          state, True)
            assert rel_l2(o[:, rows], ref_o) < 1e-6, (n, t)
            assert rel_l2(pool[slots[n, t]][None], state) < 1e-6, (n, t)
            written.add(slots[n, t].item())
    untouched = [p for p in range(pool.shape[0]) if p not in written]
    assert torch.equal(pool[untouched], before[untouched])


def test_speculative_decoding_resumes_where_the_sampler_stopped():
    """Two verify steps: the second resumes from the last accepted token of the first (its slot), and
    equals the recurrence over the accepted tokens followed by the second step's."""
    q, k, v, g, beta, _ = inputs(B=1, T=7, seed=9)
    pool = torch.zeros(8, H, DK, DV)
    slots = torch.tensor([[0, 1, 2, 3]])
    first = lambda x: x[:, :4]
    kda.fused_recurrent_kda(*map(first, (q, k, v, g, beta)), initial_state=pool, ssm_state_indices=slots)
    # the sampler kept 2 of the 4 tokens; the next step runs 3 tokens from their state, into slots 4..6
    kept = torch.cat([torch.arange(2), torch.arange(4, 7)])
    nxt = lambda x: x[:, 4:7]
    o, _ = kda.fused_recurrent_kda(*map(nxt, (q, k, v, g, beta)), initial_state=pool,
                                   ssm_state_indices=torch.tensor([[4, 5, 6, 1]]),
                                   num_accepted_tokens=torch.tensor([4]))
    # slot [0, 3] of the second table is slot 1: the state after the first step's second token
    ref_o, ref_state = ref0.recurrent(*(x[:, kept] for x in (q * DK ** -0.5, k, v, g, beta)), None, True)
    assert rel_l2(o, ref_o[:, 2:]) < 1e-6 and rel_l2(pool[6][None], ref_state) < 1e-6


def test_speculative_decoding_dense_batch():
    """Token slots without ``cu_seqlens``: ``B`` sequences of ``T`` tokens each, one row of slots per sequence,
    no ``num_accepted_tokens`` (each starts from its row's first slot, which its first token then overwrites)."""
    q, k, v, g, beta, _ = inputs(B=2, T=3, seed=6)
    pool = torch.randn(8, H, DK, DV)
    before = pool.clone()
    slots = torch.tensor([[7, 2, 5], [0, 3, 6]])
    o, _ = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots)
    for n in range(2):
        state = before[slots[n, 0]][None]
        for t in range(3):
            ref_o, state = ref0.recurrent(q[n:n + 1, t:t + 1] * DK ** -0.5, k[n:n + 1, t:t + 1], v[n:n + 1, t:t + 1],
                                          g[n:n + 1, t:t + 1], beta[n:n + 1, t:t + 1], state, True)
            assert rel_l2(o[n:n + 1, t:t + 1], ref_o) < 1e-6 and rel_l2(pool[slots[n, t]][None], state) < 1e-6
    assert torch.equal(pool[[1, 4]], before[[1, 4]])


@pytest.mark.parametrize("change,message", [
    (dict(accepted=[2, 1, 5, 1, 3]), r"num_accepted_tokens must lie in \[1, 4\]"),
    (dict(accepted=[0, 1, 1, 1, 1]), r"num_accepted_tokens must lie in \[1, 4\]"),
    (dict(table=lambda s: s.index_put_((torch.tensor(2), torch.tensor(3)), torch.tensor(0))),
     "sequence 2 starts from slot 0, which sequence 0 writes in the same step"),
    (dict(table=lambda s: s.index_put_((torch.tensor(3), torch.tensor(0)), torch.tensor(0))), "two tokens would write"),
    (dict(table=lambda s: s.index_put_((torch.tensor(3), torch.tensor(1)), torch.tensor(99))),
     r"every slot a sequence reads or writes must lie in \[0, 24\)"),
    (dict(table=lambda s: s[:, :3]), r"a sequence of 4 tokens needs T_max >= 4"),
    (dict(table=lambda s: s[:4]), r"must have a row per sequence \(N = 5\)"),
    (dict(accepted=torch.ones(4, dtype=torch.int64)), r"num_accepted_tokens must be an integer tensor \[N\] = \[5\]"),
])
def test_bad_token_slots_raise(change, message):
    """Token slots that would race or reach past the pool, and accepted counts out of range: clear errors."""
    lengths = [3, 0, 1, 4, 2]
    q, k, v, g, beta, _ = inputs(B=1, T=sum(lengths), seed=4)
    slots = torch.arange(20).reshape(5, 4)
    if "table" in change:
        slots = change["table"](slots.clone())
    accepted = change.get("accepted", [2, 1, 4, 1, 3])
    accepted = accepted if isinstance(accepted, torch.Tensor) else torch.tensor(accepted)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    with pytest.raises(ValueError, match=message):
        kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=torch.zeros(24, H, DK, DV), cu_seqlens=cu,
                                ssm_state_indices=slots, num_accepted_tokens=accepted)


def test_accepted_tokens_need_token_slots():
    q, k, v, g, beta, _ = inputs()
    with pytest.raises(ValueError, match=r"num_accepted_tokens needs ssm_state_indices \[N, T_max\]"):
        kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=torch.zeros(3, H, DK, DV),
                                ssm_state_indices=torch.tensor([0, 1]), num_accepted_tokens=torch.tensor([1, 1]))


def test_clear_errors():
    q, k, v, g, beta, h0 = inputs()
    with pytest.raises(ValueError, match="state pool is written in place: it must be float32"):
        kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="ssm_state_indices needs initial_state"):
        kda.fused_recurrent_kda(q, k, v, g, beta, ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="use_gate_in_kernel needs A_log"):
        kda.fused_recurrent_kda(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="pass use_gate_in_kernel=True"):
        kda.fused_recurrent_kda(q, k, v, g, beta, A_log=torch.zeros(H))
    with pytest.raises(ValueError, match=r"A_log must be a floating tensor of shape \[2\]"):
        kda.fused_recurrent_kda(q, k, v, g, beta, A_log=torch.zeros(3), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"dt_bias must be a floating tensor of shape \[32\]"):
        kda.fused_recurrent_kda(q, k, v, g, beta, A_log=torch.zeros(H), dt_bias=torch.zeros(H),
                                use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="lower_bound must be a finite negative number"):
        kda.fused_recurrent_kda(q, k, v, g, beta, lower_bound=5.0, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel"):
        kda.fused_recurrent_kda(q, k, v, g, beta, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="state_v_first is not supported"):
        kda.fused_recurrent_kda(q, k, v, g, beta, state_v_first=True)
    with pytest.raises(ValueError, match="g must be finite"):
        kda.fused_recurrent_kda(q, k, v, g / 0, beta, A_log=torch.zeros(H), use_gate_in_kernel=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'gate'"):
        kda.fused_recurrent_kda(q, k, v, g, beta, gate=1)
    with pytest.raises(ValueError, match="gv .* is not supported"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, gv=torch.zeros(B, T, H, DV))
    with pytest.raises(ValueError, match="pass one gate"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g=g[..., 0], gk=g)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, H, DK\]"):
        kda.fused_recurrent_kda(q, k, v, g[..., 0], beta)
    with pytest.raises(ValueError, match="g must be finite and <= 0"):
        kda.fused_recurrent_kda(q, k, v, -g, beta)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        kda.fused_recurrent_kda(q, k, v, g, beta + 1)


def test_activations_in_the_call_are_the_formulas():
    """fla's gate and beta activations: -exp(A_log) softplus(g + dt_bias), lower_bound
    sigmoid(exp(A_log) (g + dt_bias)), sigmoid(beta) and 2 sigmoid(beta)."""
    q, k, v, raw, _, h0 = inputs()
    gen = torch.Generator().manual_seed(5)
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * DK, generator=gen)
    logits = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    x = raw + dt_bias.double().view(H, DK)
    softplus = -torch.exp(A_log.double())[:, None] * torch.nn.functional.softplus(x)
    bounded = -3.0 * torch.sigmoid(torch.exp(A_log.double())[:, None] * x)
    for gate, kw in ((softplus, {}), (bounded, dict(lower_bound=-3.0))):
        for beta, extra in ((torch.sigmoid(logits), {}), (2 * torch.sigmoid(logits), dict(allow_neg_eigval=True))):
            o, ht = kda.fused_recurrent_kda(q, k, v, raw, logits, A_log=A_log, dt_bias=dt_bias, initial_state=h0,
                                            output_final_state=True, use_gate_in_kernel=True,
                                            use_beta_sigmoid_in_kernel=True, **kw, **extra)
            ref_o, ref_ht = ref0.recurrent(q * DK ** -0.5, k, v, gate, beta, h0, True)
            assert rel_l2(o, ref_o) < 1e-12 and rel_l2(ht, ref_ht) < 1e-6
    g_head = torch.randn(B, T, H, generator=gen, dtype=torch.float64)           # GDN: A_log, dt_bias [HV]
    o, _ = kda.fused_recurrent_gated_delta_rule(q, k, v, g=g_head, beta=torch.sigmoid(logits), A_log=A_log,
                                                dt_bias=dt_bias[:H], use_gate_in_kernel=True)
    gate = -torch.exp(A_log.double()) * torch.nn.functional.softplus(g_head + dt_bias[:H].double())
    ref_o, _ = ref0.recurrent(q * DK ** -0.5, k, v, gate, torch.sigmoid(logits))
    assert rel_l2(o, ref_o) < 1e-12


def test_chunk_kda_takes_the_same_activations():
    """chunk_kda with fla's activation arguments (applied in torch before the kernels) against
    fused_recurrent_kda (which applies them as it reads each token) and the formulas."""
    q, k, v, raw, _, h0 = inputs()
    gen = torch.Generator().manual_seed(6)
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H * DK, generator=gen)
    logits = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    for kw in (dict(A_log=A_log, dt_bias=dt_bias), dict(dt_bias=dt_bias, safe_gate=True, lower_bound=-4.0)):
        kw_decode = {n: x for n, x in kw.items() if n != "safe_gate"}
        o, ht = kda.chunk_kda(q, k, v, raw, logits, initial_state=h0, output_final_state=True, use_gate_in_kernel=True,
                              use_beta_sigmoid_in_kernel=True, **kw)
        o_r, ht_r = kda.fused_recurrent_kda(q, k, v, raw, logits, initial_state=h0, output_final_state=True,
                                            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, **kw_decode)
        assert rel_l2(o, o_r) < 1e-12 and rel_l2(ht, ht_r) < 1e-6
    with pytest.raises(ValueError, match="allow_neg_eigval is not supported by the chunked forward"):
        kda.chunk_kda(q, k, v, raw, logits, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="safe_gate and lower_bound go together"):
        kda.chunk_kda(q, k, v, raw, logits, use_gate_in_kernel=True, lower_bound=-4.0, dt_bias=dt_bias)
    with pytest.raises(ValueError, match="g must be finite and <= 0"):              # raw gates without the flag
        kda.chunk_kda(q, k, v, -raw, torch.rand(B, T, H, dtype=torch.float64))
