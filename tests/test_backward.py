"""Gradients on the CPU (issue 18, first step): every public function is differentiable through its
float64 path. torch.autograd.gradcheck on small shapes, and the gradients of chunk_kda equal the
autograd gradients of the float64 token recurrence (tails, packed sequences, initial and final
states, runs of -20). On CUDA an input that asks for gradients raises until the backward kernels
exist (a GPU test)."""

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

import random_inputs

F64 = dict(dtype=torch.float64)


def inputs(B=1, T=9, H=2, K=4, V=3, seed=0, per_channel=True, strong=False):
    drawn = random_inputs.gated_delta(B, T, H, K, V, gate="channel" if per_channel else "head", strong=strong, seed=seed)
    return [x.requires_grad_() for x in drawn[:6]]

def check(fn, *args):
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("op", ["linear_attention", "decay_attention", "gated_scalar", "gated_channel", "delta_rule",
                                "chunk_kda", "chunk_gated_delta_rule", "fused_recurrent_kda",
                                "fused_recurrent_gated_delta_rule"])
def test_gradcheck(op):
    q, k, v, g, beta, h0 = inputs()
    g_head = torch.nn.functional.logsigmoid(torch.randn(1, 9, 2, **F64)).requires_grad_()
    fns = {
        "linear_attention": (lambda q, k, v, h0: kda.linear_attention(q, k, v, initial_state=h0), (q, k, v, h0)),
        "decay_attention": (lambda q, k, v: kda.decay_attention(q, k, v, 0.9), (q, k, v)),
        "gated_scalar": (lambda q, k, v, g: kda.gated_attention(q, k, v, g), (q, k, v, g_head)),
        "gated_channel": (lambda q, k, v, g: kda.gated_attention(q, k, v, g), (q, k, v, g)),
        "delta_rule": (lambda q, k, v, b: kda.delta_rule(q, k, v, b), (q, k, v, beta)),
        "chunk_kda": (lambda *a: kda.chunk_kda(*a[:5], initial_state=a[5])[0], (q, k, v, g, beta, h0)),
        "chunk_gated_delta_rule": (lambda *a: kda.chunk_gated_delta_rule(*a[:5], initial_state=a[5])[0],
                                   (q, k, v, g_head, beta, h0)),
        "fused_recurrent_kda": (lambda *a: kda.fused_recurrent_kda(*a[:5], initial_state=a[5])[0],
                                (q, k, v, g, beta, h0)),
        "fused_recurrent_gated_delta_rule": (lambda *a: kda.fused_recurrent_gated_delta_rule(
            *a[:3], g=a[3], beta=a[4])[0], (q, k, v, g_head, beta)),
    }
    fn, args = fns[op]
    check(fn, *args)


def test_gradcheck_packed_sequences():
    q, k, v, g, beta, _ = inputs(T=11)
    h0 = torch.randn(3, 2, 4, 3, **F64).requires_grad_()
    cu = torch.tensor([0, 4, 4, 11])
    check(lambda *a: kda.chunk_kda(*a[:5], initial_state=a[5], cu_seqlens=cu)[0], q, k, v, g, beta, h0)


@pytest.mark.parametrize("strong", [False, True], ids=["logsigmoid", "runs_of_-20"])
def test_chunk_kda_gradients_are_the_recurrence_gradients(strong):
    """Through the chunked path (T = 70: one full chunk and a tail) against autograd through the
    token recurrence, for a loss on the output and the final state."""
    q, k, v, g, beta, h0 = inputs(B=2, T=70, K=8, V=5, seed=3, strong=strong)
    gen = torch.Generator().manual_seed(4)
    w_o, w_s = torch.randn(2, 70, 2, 5, generator=gen, **F64), torch.randn(2, 2, 8, 5, generator=gen, **F64)
    grads = []
    for run in (lambda: kda.chunk_kda(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True),
                lambda: ref0.recurrent(q, k, v, g, beta, h0, True)):
        o, final = run()
        loss = (o * w_o).sum() + (final.double() * w_s).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, g, beta, h0)))
    for name, a, b in zip("q k v g beta h0".split(), *grads):      # the final state is returned in float32,
        assert rel_l2(a, b) < 1e-7, f"{name}: {rel_l2(a, b):.1e}"  # and so is the gradient that flows into it
