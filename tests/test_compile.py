"""The kda:: custom ops (kda.custom_ops) on the CPU: torch.library.opcheck of each (schema, fake
implementation, aot dispatch), and torch.compile with fullgraph=True of a prefill and a decode
step through the public functions, equal to eager."""

import pytest
import torch

import kda

import random_inputs

H, K, V = 2, 16, 8


def inputs(B, T, HV=H, per_channel=True, seed=0):
    drawn = random_inputs.gated_delta(B, T, HV, K, V, HQ=H, gate="channel" if per_channel else "head",
                                      dtype=torch.float32, seed=seed)
    return drawn[:5]


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_opcheck(per_channel):
    q, k, v, g, beta = inputs(1, 20, per_channel=per_channel)
    cu = torch.tensor([0, 7, 20])
    h0 = torch.randn(2, H, K, V)
    torch.library.opcheck(torch.ops.kda.chunk_gated_delta.default,
                          (q, k, v, g, beta, K ** -0.5, h0, True, False, cu, None))
    torch.library.opcheck(torch.ops.kda.chunk_gated_delta.default,
                          (q, k, v, g, beta, 0.5, None, False, True, None, None))
    torch.library.opcheck(torch.ops.kda.fused_recurrent.default,
                          (q, k, v, g, beta, K ** -0.5, h0, True, False, cu, None))
    pool = torch.randn(4, H, K, V)
    torch.library.opcheck(torch.ops.kda.fused_recurrent_pooled.default,
                          (q, k, v, g, beta, K ** -0.5, pool, torch.tensor([3, 1]), False, cu, None))


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_opcheck_with_transposed_inputs(per_channel):
    """Inputs laid out as a convolution over time hands them over (``[B, T, C]`` viewed from ``[B, C, T]``): the
    real outputs and gradients are contiguous, and so are the fakes' (a compiled layer on CUDA asserted it)."""
    def time_minor(x):
        return x.movedim(1, -1).contiguous().movedim(-1, 1)
    q, k, v, g, beta = (time_minor(x) for x in inputs(1, 20, per_channel=per_channel))
    assert not v.is_contiguous()
    h0 = torch.randn(1, H, K, V)
    torch.library.opcheck(torch.ops.kda.chunk_gated_delta.default,
                          (q, k, v, g, beta, K ** -0.5, h0, True, False, None, None))
    torch.library.opcheck(torch.ops.kda.fused_recurrent.default,
                          (q, k, v, g, beta, K ** -0.5, h0, True, False, None, None))
    o, _ = torch.ops.kda.chunk_gated_delta(q, k, v, g, beta, K ** -0.5, h0, True, False, None, None)
    assert o.is_contiguous()


def layer(q, k, v, g, beta, cu, pool, slots, q1, k1, v1, g1, beta1):
    """A prefill of packed sequences into fresh states, then one decode step from a pool."""
    o, states = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu,
                              use_qk_l2norm_in_kernel=True)
    o1, _ = kda.fused_recurrent_kda(q1, k1, v1, g1, beta1, initial_state=pool, ssm_state_indices=slots,
                                    use_qk_l2norm_in_kernel=True)
    return o, states, o1


def test_compile_fullgraph_prefill_and_decode_equal_eager():
    q, k, v, g, beta = inputs(1, 30)
    cu = torch.tensor([0, 11, 30])
    q1, k1, v1, g1, beta1 = inputs(2, 1, seed=1)
    slots = torch.tensor([2, 0])
    pool_eager, pool_compiled = torch.randn(3, H, K, V), None
    pool_compiled = pool_eager.clone()
    want = layer(q, k, v, g, beta, cu, pool_eager, slots, q1, k1, v1, g1, beta1)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v, g, beta, cu, pool_compiled, slots, q1, k1, v1, g1, beta1)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(pool_compiled, pool_eager)                # the pool updated in place, once
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(layer, fullgraph=True, backend=record)(q, k, v, g, beta, cu, pool_compiled.clone(), slots,
                                                         q1, k1, v1, g1, beta1)
    called = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert {"kda.chunk_gated_delta", "kda.fused_recurrent_pooled"} <= called, called


def test_compile_gdn_decode_without_states():
    q, k, v, g, beta = inputs(3, 2, HV=2 * H, per_channel=False)
    fn = lambda *a: kda.fused_recurrent_gated_delta_rule(a[0], a[1], a[2], g=a[3], beta=a[4], output_final_state=True)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, g, beta)
    want = fn(q, k, v, g, beta)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize("op", ["chunk_kda", "fused_recurrent_kda"])
def test_compiled_gradients_equal_eager(op):
    """A compiled graph trains: the ops' backward (register_autograd) recomputes the float64 path
    and gives the gradients of an eager call, here with packed sequences, initial states and a loss
    on the final states too; opcheck's autograd tests pass on inputs that require grad."""
    fn = getattr(kda, op)
    q, k, v, g, beta = (x.double() for x in inputs(1, 25, seed=3))
    h0 = torch.randn(2, H, K, V, dtype=torch.float64)
    cu = torch.tensor([0, 9, 25])
    leaves = lambda: [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]

    def loss(q, k, v, g, beta, h0):
        o, final = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        return (o * o).sum() + final.sum()

    eager, compiled = leaves(), leaves()
    want = torch.autograd.grad(loss(*eager), eager)
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(*compiled), compiled)
    for a, b in zip(got, want):                    # the final state is float32 on both paths; the graph
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)      # rounds its gradient in another order
    target = torch.ops.kda.chunk_gated_delta.default if op == "chunk_kda" else torch.ops.kda.fused_recurrent.default
    torch.library.opcheck(target, (*leaves()[:5], K ** -0.5, leaves()[5], True, False, cu, None))
