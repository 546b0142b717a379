"""The decode kernel (kda.kernels.decode.fused_recurrent through kda.fused_recurrent_kda and
kda.fused_recurrent_gated_delta_rule) on the GPU against the float64 token recurrence (marked
``gpu``), outputs poisoned with NaN: dense and packed sequences, grouped value heads, both gate
forms, the state pool updated in place, and a prefill by chunk_kda continued by decode steps."""

import pytest
import torch

import kda
from kda.bench import captured
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

import random_inputs
from test_layer import prefill_then_decode

pytestmark = pytest.mark.gpu

BOUND = 5e-3        # bf16 / fp16 inputs and outputs, float32 state


def inputs(B, T, H, HV, DK, DV, dtype, per_channel, seed):
    return random_inputs.gated_delta(B, T, HV, DK, DV, HQ=H, gate="channel" if per_channel else "head",
                                     dtype=torch.float32, cast=dtype, device="cuda", seed=seed)[:6]


def reference(q, k, v, g, beta, h0):
    group = v.shape[2] // q.shape[2]
    rep = lambda x: x.double().repeat_interleave(group, dim=2)
    return ref0.recurrent(rep(q) * q.shape[-1] ** -0.5, rep(k), v, g, beta, h0, True)


def call(per_channel, q, k, v, g, beta, **kw):
    if per_channel:
        return kda.fused_recurrent_kda(q, k, v, g, beta, **kw)
    return kda.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 1, 2, 2, 128, 128), (3, 5, 2, 4, 64, 128), (1, 7, 1, 1, 128, 64)])
def test_decode_against_token_recurrence(shape, dtype, per_channel, poisoned):
    q, k, v, g, beta, h0 = inputs(*shape, dtype, per_channel, seed=sum(shape))
    o, ht = call(per_channel, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_ht = reference(q, k, v, g, beta, h0)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND
    o0, none = call(per_channel, q, k, v, g, beta)                     # no initial state, no final state
    assert none is None and rel_l2(o0, reference(q, k, v, g, beta, None)[0]) <= BOUND


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_packed_sequences_into_a_pool(per_channel, poisoned):
    q, k, v, g, beta, _ = inputs(1, 9, 2, 4, 128, 128, torch.bfloat16, per_channel, seed=3)
    bounds = [0, 1, 1, 4, 9]                                             # lengths 1, 0, 3, 5
    pool = torch.randn(6, 4, 128, 128, device="cuda")
    before = pool.clone()
    slots = [5, 0, 3, 1]
    o, final = call(per_channel, q, k, v, g, beta, initial_state=pool, output_final_state=True,
                    cu_seqlens=torch.tensor(bounds, device="cuda"),
                    ssm_state_indices=torch.tensor(slots, device="cuda"))
    assert final is pool
    for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
        ref_o, ref_ht = reference(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], before[slots[n]][None])
        if e > s:
            assert rel_l2(o[:, s:e], ref_o) <= BOUND
        assert rel_l2(pool[slots[n]][None], ref_ht) <= BOUND
    assert torch.equal(pool[[2, 4]], before[[2, 4]])                     # slots no sequence owns


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "dense"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_speculative_decoding_token_slots(per_channel, packed, poisoned, monkeypatch):
    """``TOKEN_SLOTS``: a verify step with ``ssm_state_indices [N, T_max]`` and ``num_accepted_tokens`` (packed:
    lengths 1, 0, 3, 4; dense: 2 sequences of 3 tokens; grouped value heads): each output and the state after
    each token (in its slot) against the float64 recurrence from the accepted token's slot; the slots no token
    writes untouched. With the switch off the call raises."""
    from kda.kernels import decode

    lengths = [1, 0, 3, 4] if packed else [3, 3]
    N, TI = len(lengths), 4
    q, k, v, g, beta, _ = inputs(1 if packed else N, sum(lengths) if packed else 3, 2, 4, 128, 128, torch.bfloat16,
                                 per_channel, seed=13)
    pool = torch.randn(N * TI + 2, 4, 128, 128, device="cuda")
    before = pool.clone()
    slots = torch.arange(N * TI, device="cuda").flip(0).reshape(N, TI)
    accepted = torch.tensor([2, 4, 1, 3][:N], device="cuda")
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    run = lambda: call(per_channel, q, k, v, g, beta, initial_state=pool, output_final_state=True, cu_seqlens=cu,
                       ssm_state_indices=slots, num_accepted_tokens=accepted)
    monkeypatch.setattr(decode, "TOKEN_SLOTS", False)
    with pytest.raises(NotImplementedError, match="TOKEN_SLOTS"):
        run()
    monkeypatch.setattr(decode, "TOKEN_SLOTS", True)
    o, final = run()
    assert final is pool and torch.isfinite(o).all()
    written = set()
    for n, L in enumerate(lengths):
        b, s = (0, sum(lengths[:n])) if packed else (n, 0)
        state = before[slots[n, accepted[n] - 1]][None]
        for t in range(L):
            rows = (slice(b, b + 1), slice(s + t, s + t + 1))
            ref_o, state = reference(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
            assert rel_l2(o[rows], ref_o) <= BOUND, (n, t)
            assert rel_l2(pool[slots[n, t]][None], state) <= BOUND, (n, t)
            written.add(slots[n, t].item())
    untouched = [p for p in range(pool.shape[0]) if p not in written]
    assert torch.equal(pool[untouched], before[untouched])


BAD_VALUES = {
    "gate above 0": (dict(), lambda g, beta: g.view(-1)[5].fill_(0.5), "g must be finite and <= 0"),
    "gate NaN": (dict(), lambda g, beta: g.view(-1)[-1].fill_(float("nan")), "g must be finite"),
    "beta above 1": (dict(), lambda g, beta: beta.view(-1)[3].fill_(1.5), r"beta must lie in \[0, 1\]"),
    "raw gate inf": (dict(use_gate_in_kernel=True, lower_bound=-5.0), lambda g, beta: g.view(-1)[0].fill_(float("inf")),
                     "g must be finite"),
    "raw beta NaN": (dict(use_beta_sigmoid_in_kernel=True), lambda g, beta: beta.view(-1)[0].fill_(float("nan")),
                     "beta must be finite"),
    "slot out of range": (dict(), None, "ssm_state_indices must be distinct slots"),
    "slot taken twice": (dict(), None, "ssm_state_indices must be distinct slots"),
    "slot past int32": (dict(), None, "ssm_state_indices must be distinct slots"),
}


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_value_raises_and_leaves_the_pool_as_it_was(case, per_channel):
    """On CUDA the values are checked on the GPU (``value_checks``) and the guarded kernel writes
    nothing when one is flagged: the call raises the host check's error, and the pool is unchanged."""
    options, spoil, message = BAD_VALUES[case]
    q, k, v, g, beta, _ = inputs(4, 1, 2, 4, 128, 128, torch.bfloat16, per_channel, seed=11)
    pool = torch.randn(6, 4, 128, 128, device="cuda")
    slots = {"slot out of range": [5, 0, 6, 1], "slot taken twice": [5, 0, 5, 1],
             "slot past int32": [5, 0, 2 ** 32 + 3, 1]}.get(case, [5, 0, 3, 1])   # int64: wraps to 3 as int32
    if spoil is not None:
        spoil(g, beta)
    before = pool.clone()
    with pytest.raises(ValueError, match=message):
        call(per_channel, q, k, v, g, beta, initial_state=pool, ssm_state_indices=torch.tensor(slots, device="cuda"),
             **options)
    torch.cuda.synchronize()
    assert torch.equal(pool, before), "a flagged step wrote the pool"


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_deferred_checks_raise_at_the_next_call(per_channel, monkeypatch):
    """``DEFERRED_CHECKS``: a step with a bad gate returns without waiting and writes nothing (the pool as it
    was); the next decode call raises its error before it runs, as does ``raise_pending_checks``; good steps
    equal the waiting form's, bit for bit."""
    from kda import decode

    monkeypatch.setattr(decode, "DEFERRED_CHECKS", True)
    q, k, v, g, beta, _ = inputs(4, 1, 2, 4, 128, 128, torch.bfloat16, per_channel, seed=17)
    pool = torch.randn(6, 4, 128, 128, device="cuda")
    slots = torch.tensor([5, 0, 3, 1], device="cuda")
    step = lambda g, pool: call(per_channel, q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots)[0]
    waiting_pool = pool.clone()
    monkeypatch.setattr(decode, "DEFERRED_CHECKS", False)
    o_waiting = step(g, waiting_pool)
    monkeypatch.setattr(decode, "DEFERRED_CHECKS", True)
    o = step(g, pool)
    decode.raise_pending_checks()
    assert torch.equal(o, o_waiting) and torch.equal(pool, waiting_pool)
    bad = g.clone()
    bad.view(-1)[3] = 0.5
    before = pool.clone()
    step(bad, pool)                                      # returns: nothing read back
    torch.cuda.synchronize()
    assert torch.equal(pool, before), "a flagged step wrote the pool"
    with pytest.raises(ValueError, match="an earlier decode step .* g must be finite and <= 0"):
        step(g, pool)
    assert torch.equal(pool, before), "the call that raised ran its step"
    step(bad, pool)
    with pytest.raises(ValueError, match="an earlier decode step"):
        decode.raise_pending_checks()
    decode.raise_pending_checks()                        # read once: nothing pending


def test_the_guarded_kernel_writes_nothing_when_flagged():
    """``fused_recurrent(guarded=True)`` with a flag set by hand: the output stays poisoned and the
    final states unwritten; with the flags clear it computes as the unguarded kernel, bit for bit."""
    from kda.kernels import decode
    from kda.kernels.build import compile_program

    q, k, v, g, beta, h0 = inputs(2, 3, 2, 2, 128, 128, torch.bfloat16, True, seed=12)
    build = lambda guarded: compile_program(decode.fused_recurrent, (), DK=128, DV=128, guarded=guarded)
    zeros = lambda *shape: torch.zeros(shape, device="cuda")
    no_table = torch.zeros(1, dtype=torch.int32, device="cuda")
    outputs = []
    for guarded, flags in [(False, no_table), (True, torch.zeros(3, dtype=torch.int32, device="cuda")),
                           (True, torch.tensor([0, 1, 0], dtype=torch.int32, device="cuda"))]:
        o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        build(guarded)(q, k, v, g, beta, 128 ** -0.5, zeros(2), zeros(2, 128), 0.0, o, h0, ht, no_table, no_table,
                       no_table, flags)
        outputs.append((o, ht))
    (o, ht), (o_guarded, ht_guarded), (o_flagged, ht_flagged) = outputs
    assert torch.equal(o, o_guarded) and torch.equal(ht, ht_guarded)
    assert o_flagged.isnan().all() and ht_flagged.isnan().all()


def test_prefill_then_decode_is_one_forward():
    """chunk_kda over 100 tokens, then three decode steps from its final state: the outputs of the
    steps are those of chunk_kda over all 103 tokens."""
    q, k, v, g, beta, h0 = inputs(2, 103, 2, 2, 128, 128, torch.bfloat16, True, seed=7)
    _, state = kda.chunk_kda(q[:, :100], k[:, :100], v[:, :100], g[:, :100], beta[:, :100], initial_state=h0,
                             output_final_state=True)
    steps = []
    for t in range(100, 103):
        sl = slice(t, t + 1)
        o_t, state = kda.fused_recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                                             initial_state=state, output_final_state=True)
        steps.append(o_t)
    ref_o, ref_ht = reference(q, k, v, g, beta, h0)
    assert rel_l2(torch.cat(steps, dim=1), ref_o[:, 100:]) <= BOUND and rel_l2(state, ref_ht) <= BOUND


def test_a_decode_step_replays_in_a_cuda_graph():
    """A pooled decode step captured once (the value checks skip themselves during capture) and
    replayed with new tokens: each replay equals an eager step on a copy of the pool."""
    B, H, HV, DK, DV = 4, 2, 4, 128, 128
    q, k, v, g, beta, _ = inputs(B, 1, H, HV, DK, DV, torch.bfloat16, True, seed=11)
    pool = torch.randn(6, HV, DK, DV, device="cuda")
    slots = torch.tensor([5, 0, 3, 1], device="cuda")
    step = lambda: kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots)[0]
    graph, out = captured(step)
    for seed in range(3):
        new = inputs(B, 1, H, HV, DK, DV, torch.bfloat16, True, seed=100 + seed)
        for static, fresh in zip((q, k, v, g, beta), new[:5]):
            static.copy_(fresh)
        pool_ref = pool.clone()
        o_ref, _ = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool_ref, ssm_state_indices=slots)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, o_ref) and torch.equal(pool, pool_ref)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("bounded", [False, True], ids=["softplus", "lower_bound"])
def test_activations_in_the_kernel(per_channel, bounded, poisoned):
    """Raw gates and beta logits activated by the kernel as it reads them, against the CPU path
    (the same formulas in float64, then the recurrence)."""
    q, k, v, raw, _, h0 = inputs(2, 5, 2, 4, 128, 128, torch.bfloat16, per_channel, seed=21)
    gen = torch.Generator(device="cuda").manual_seed(22)
    logits = torch.randn(2, 5, 4, generator=gen, device="cuda")
    A_log = torch.randn(4, generator=gen, device="cuda")
    dt_bias = torch.randn(4 * (128 if per_channel else 1), generator=gen, device="cuda")
    kw = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              allow_neg_eigval=True, initial_state=h0, output_final_state=True,
              **(dict(lower_bound=-5.0) if bounded else {}))
    if per_channel:
        o, ht = kda.fused_recurrent_kda(q, k, v, raw, logits, **kw)
        want = kda.fused_recurrent_kda(*(x.cpu() for x in (q, k, v, raw, logits)),
                                       **{n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()})
    else:
        o, ht = kda.fused_recurrent_gated_delta_rule(q, k, v, g=raw, beta=logits, **kw)
        want = kda.fused_recurrent_gated_delta_rule(q.cpu(), k.cpu(), v.cpu(), g=raw.cpu(), beta=logits.cpu(),
                                                    **{n: (x.cpu() if isinstance(x, torch.Tensor) else x)
                                                       for n, x in kw.items()})
    assert rel_l2(o, want[0]) <= BOUND and rel_l2(ht, want[1]) <= BOUND


def test_layer_prefill_then_decode_on_the_gpu():
    """The KimiDeltaAttention layer in bf16: chunk_kda for the prefill, then decode steps with the
    activations in the kernel, against one prefill over all the tokens."""
    from kda.layer import KimiDeltaAttention

    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=256, num_heads=2, head_dim=128, num_v_heads=4).to("cuda", torch.bfloat16)
    x = torch.randn(2, 70, 256, device="cuda", dtype=torch.bfloat16)
    full, _, stepped, _ = prefill_then_decode(layer, x, 64)
    assert rel_l2(stepped, full) <= 2e-2


def test_chunk_kda_activations_on_the_gpu(poisoned):
    """chunk_kda with fla's activation arguments on the GPU against its CPU path."""
    q, k, v, raw, _, h0 = inputs(1, 150, 2, 2, 128, 128, torch.bfloat16, True, seed=31)
    gen = torch.Generator(device="cuda").manual_seed(32)
    logits = torch.randn(1, 150, 2, generator=gen, device="cuda")
    kw = dict(A_log=torch.randn(2, generator=gen, device="cuda"),
              dt_bias=torch.randn(256, generator=gen, device="cuda"),
              use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, initial_state=h0, output_final_state=True)
    o, ht = kda.chunk_kda(q, k, v, raw, logits, **kw)
    cpu = {n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    want = kda.chunk_kda(*(x.cpu() for x in (q, k, v, raw, logits)), **cpu)
    assert rel_l2(o, want[0]) <= BOUND and rel_l2(ht, want[1]) <= BOUND


def test_a_dense_prefill_replays_in_a_cuda_graph(monkeypatch):
    """chunk_kda on a batch of equal lengths, captured once and replayed with new inputs: equal to
    eager calls. With ``DEVICE_CHUNK_TABLES`` off, packed sequences refuse capture with an error that names it
    (their chunk table is then built on the host)."""
    from kda import gated_delta

    q, k, v, g, beta, h0 = inputs(2, 130, 2, 2, 128, 128, torch.bfloat16, True, seed=51)
    prefill = lambda: kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    graph, (out, state) = captured(prefill)
    for seed in range(2):
        for static, fresh in zip((q, k, v, g, beta, h0), inputs(2, 130, 2, 2, 128, 128, torch.bfloat16, True,
                                                                  seed=60 + seed)):
            static.copy_(fresh)
        o_ref, s_ref = prefill()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, o_ref) and torch.equal(state, s_ref)
    packed = torch.cuda.CUDAGraph()
    cu = torch.tensor([0, 100, 130], device="cuda")
    cu_cpu, first = cu.cpu(), [x[:1].contiguous() for x in (q, k, v, g, beta)]   # nothing copied while capturing
    monkeypatch.setattr(gated_delta, "DEVICE_CHUNK_TABLES", False)
    with pytest.raises(ValueError, match="CUDA graph with kda.gated_delta.DEVICE_CHUNK_TABLES off"):
        with torch.cuda.graph(packed):
            kda.chunk_kda(*first, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_a_packed_prefill_replays_in_a_cuda_graph(per_channel, monkeypatch):
    """``DEVICE_CHUNK_TABLES``: a packed prefill (``cu_seqlens`` on the device only) captured once, its chunk table
    made on the device, then replayed with other boundaries of the same ``T`` and ``N`` (an empty sequence, one
    token, lengths not multiples of 64) and new inputs: equal to eager calls, which build the table on the host."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "DEVICE_CHUNK_TABLES", True)
    op = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    T = 300
    q, k, v, g, beta, _ = inputs(1, T, 2, 2, 128, 128, torch.bfloat16, per_channel, seed=71)
    h0 = torch.randn(4, 2, 128, 128, device="cuda")
    cu = torch.tensor([0, 130, 130, 131, T], device="cuda")
    prefill = lambda: op(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    graph, (out, state) = captured(prefill)
    for seed, bounds in enumerate(([0, 64, 65, 65, T], [0, 1, 200, 290, T], [0, 130, 130, 131, T])):
        cu.copy_(torch.tensor(bounds, device="cuda"))
        for static, fresh in zip((q, k, v, g, beta), inputs(1, T, 2, 2, 128, 128, torch.bfloat16, per_channel,
                                                              seed=80 + seed)):
            static.copy_(fresh)
        o_ref, s_ref = op(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(state).all()
        assert rel_l2(out, o_ref.double()) <= 1e-6 and rel_l2(state, s_ref.double()) <= 1e-6, bounds


def test_inputs_that_ask_for_gradients_raise_on_cuda(monkeypatch):
    """The decode step has no backward, and the chunked ops' backward has a switch: an input that asks for
    gradients gets an error that names it (and the switch), not an output that silently has no gradient;
    under torch.no_grad the calls run."""
    from kda import cuda_autograd

    q, k, v, g, beta, h0 = inputs(1, 5, 2, 2, 128, 128, torch.bfloat16, True, seed=41)
    q.requires_grad_()
    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", False)
    with pytest.raises(ValueError, match="q requires grad, but the CUDA backward is switched off.*DEVICE_BACKWARD"):
        kda.chunk_kda(q, k, v, g, beta)
    with pytest.raises(ValueError, match="q requires grad, but the CUDA kernels of this call have no backward"):
        kda.fused_recurrent_kda(q, k, v, g, beta)
    with torch.no_grad():
        kda.chunk_kda(q, k, v, g, beta)
        kda.fused_recurrent_kda(q, k, v, g, beta)


@pytest.mark.parametrize("per_channel", [True, False])
def test_decode_compiles_fullgraph_on_cuda(per_channel):
    """torch.compile(fullgraph=True) of a decode step on CUDA tensors: dynamo traces the checks (not the
    CUDA-graph capture query, which it cannot), then the op; it equals eager."""
    torch._dynamo.reset()
    q, k, v, g, beta, h0 = inputs(4, 1, 2, 4, 128, 128, torch.bfloat16, per_channel, seed=7)
    step = lambda *a: call(per_channel, *a, initial_state=h0, output_final_state=True)
    want = step(q, k, v, g, beta)
    got = torch.compile(step, fullgraph=True)(q, k, v, g, beta)
    assert rel_l2(got[0], want[0]) < 1e-6 and rel_l2(got[1], want[1]) < 1e-6
