"""The hand-derived chunked backward (kda.reference.backward) against autograd through the float64
token recurrences: every level's gate form, with and without the delta rule, tails, several
chunks, initial states and a final-state gradient, strong gates, packed sequences."""

import pytest
import torch

from kda.metrics import rel_l2
from kda.reference import backward as bwd

import random_inputs

F64 = dict(dtype=torch.float64)


def inputs(B=2, T=37, H=2, K=8, V=5, gate="channel", delta=True, strong=False, seed=0):
    return random_inputs.gated_delta(B, T, H, K, V, gate=gate, delta=delta, strong=strong, seed=seed)


@pytest.mark.parametrize("gate", ["channel", "head", "none"])
@pytest.mark.parametrize("delta", [True, False], ids=["delta", "linear"])
@pytest.mark.parametrize("strong", [False, True], ids=["logsigmoid", "runs_of_-20"])
def test_hand_backward_equals_autograd_of_the_recurrence(gate, delta, strong):
    q, k, v, g, beta, h0, do, dht = inputs(gate=gate, delta=delta, strong=strong)
    ours = bwd.chunked_backward(q, k, v, g, beta, do, dht, scale=0.5, chunk_size=16, initial_state=h0)
    want = bwd.recurrence_backward(q, k, v, g, beta, do, dht, scale=0.5, initial_state=h0)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), ours, want):
        if b is None:
            assert a is None, name
            continue
        assert not torch.isnan(a).any(), name
        assert rel_l2(a, b) < 1e-10, f"{name}: {rel_l2(a, b):.1e}"


def test_one_chunk_of_64_with_a_tail_and_no_state():
    q, k, v, g, beta, _, do, _ = inputs(B=1, T=100, K=16, V=16, seed=5)
    ours = bwd.chunked_backward(q, k, v, g, beta, do, chunk_size=64)
    want = bwd.recurrence_backward(q, k, v, g, beta, do)
    for name, a, b in zip("dq dk dv dg dbeta".split(), ours, want):
        assert rel_l2(a, b) < 1e-10, f"{name}: {rel_l2(a, b):.1e}"


def test_packed_sequences_are_independent():
    q, k, v, g, beta, _, do, _ = inputs(B=1, T=45, seed=7)
    cu = torch.tensor([0, 20, 20, 45])
    gen = torch.Generator().manual_seed(8)
    h0, dht = torch.randn(3, 2, 8, 5, generator=gen, **F64), torch.randn(3, 2, 8, 5, generator=gen, **F64)
    ours = bwd.packed_backward(q, k, v, g, beta, do, cu, dht, scale=0.5, chunk_size=16, initial_state=h0)
    assert all(x.shape[1] == 45 for x in ours[:5]) and ours[5].shape == h0.shape
    assert torch.equal(ours[5][1], dht[1])      # an empty sequence passes its final gradient through
    for n, (s, e) in [(0, (0, 20)), (2, (20, 45))]:
        pick = lambda x: x[:, s:e]
        want = bwd.recurrence_backward(pick(q), pick(k), pick(v), pick(g), pick(beta), pick(do), dht[n:n + 1],
                                       scale=0.5, initial_state=h0[n:n + 1])
        for name, a, b in zip("dq dk dv dg dbeta dh0".split(), [pick(x) for x in ours[:5]] + [ours[5][n:n + 1]], want):
            assert rel_l2(a, b) < 1e-10, f"{name}, sequence {n}: {rel_l2(a, b):.1e}"


@pytest.mark.parametrize("strong", [False, True], ids=["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_start", "states"])
def test_reverse_walk_equals_autograd_of_the_recurrence(strong, with_state):
    """GDN's backward as one walk over the chunks from the last (``scalar_gate_reverse_walk``, what a fused kernel
    computes) against autograd through the recurrence: tails, several chunks, a gate per head."""
    q, k, v, g, beta, h0, do, dht = inputs(T=45, gate="head", strong=strong, seed=11)
    h0, dht = (h0, dht) if with_state else (None, None)
    ours = bwd.scalar_gate_reverse_walk(q, k, v, g, beta, do, dht, scale=0.5, chunk_size=16, initial_state=h0)
    want = bwd.recurrence_backward(q, k, v, g, beta, do, dht, scale=0.5, initial_state=h0)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), ours, want):
        if b is None:                                   # no initial state: dh0 is the walk's, not autograd's
            continue
        assert not torch.isnan(a).any(), name
        assert rel_l2(a, b) < 1e-10, f"{name}: {rel_l2(a, b):.1e}"
