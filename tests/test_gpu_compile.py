"""torch.compile(fullgraph=True) on CUDA tensors (marked ``gpu``): the chunked ops' prefill, a training step
whose backward is the backward op's CUDA kernel (``kda.cuda_autograd``, ``kda.backward``), and the layer's
prefill and decode step, each against the same call in eager mode (the same kernels, so to float32's
rounding of the graph's own arithmetic). The decode step alone: tests/test_gpu_decode.py."""

import pytest
import torch

import kda
from kda.metrics import rel_l2

from test_gpu_level5 import inputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_prefill_compiles_fullgraph(per_channel, packed):
    """A prefill from initial states to final states (a tail chunk; packed: three sequences, one of a token,
    with the host copy of the boundaries): the graph's op runs the eager path, so the outputs are the same."""
    torch._dynamo.reset()
    B = 1 if packed else 2
    q, k, v, g, beta, _ = inputs((B, 200, 3, 128, 128), torch.bfloat16, "logsigmoid", per_channel, 5)
    cu = torch.tensor([0, 1, 130, 200], dtype=torch.int32) if packed else None
    N = 3 if packed else B
    h0 = torch.randn(N, 3, 128, 128, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    packing = dict(cu_seqlens=cu.cuda(), cu_seqlens_cpu=cu) if packed else {}
    call = lambda *a: fn(*a, initial_state=h0, output_final_state=True, **packing)
    want = call(q, k, v, g, beta)
    got = torch.compile(call, fullgraph=True)(q, k, v, g, beta)
    for name, a, b in zip(("o", "final state"), got, want):
        assert torch.isfinite(a).all() and rel_l2(a, b) < 1e-6, f"{name}: {rel_l2(a, b):.1e}"


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_training_step_compiles_fullgraph(per_channel):
    """The gradients of a compiled loss (every input, the initial state, a loss on the final state too) are
    those of the eager call: the op's backward reaches its CUDA kernel, ``kda.backward.op_gradients``."""
    torch._dynamo.reset()
    q, k, v, g, beta, h0 = inputs((2, 200, 3, 128, 128), torch.bfloat16, "logsigmoid", per_channel, 6)
    gen = torch.Generator(device="cuda").manual_seed(3)
    do = torch.randn(2, 200, 3, 128, generator=gen, device="cuda")
    dht = torch.randn(2, 3, 128, 128, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule

    def loss(q, k, v, g, beta, h0):
        o, final = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        return (o.float() * do).sum() + (final * dht).sum()

    leaves = lambda: [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    eager, compiled = leaves(), leaves()
    want = torch.autograd.grad(loss(*eager), eager)
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(*compiled), compiled)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert torch.isfinite(a).all(), f"{name}: not finite"
        assert rel_l2(a.float(), b.float()) < 1e-5, f"{name}: {rel_l2(a.float(), b.float()):.1e}"


def test_layer_prefill_and_decode_compiles_fullgraph():
    """``kda.layer.KimiDeltaAttention`` as a model calls it (raw gate, beta's sigmoid and the L2 norm in the ops):
    a compiled prefill, then a compiled decode step from its cache, each as close to the same layer in float64 on
    the CPU as eager is. Not equal to eager: inductor fuses the layer's own bf16 arithmetic around the ops (the
    projections' epilogues, the short convolution's SiLU) and rounds once where eager rounds after each operation,
    4.4e-3 relative at this size (run 105; also with the activations in torch, run 104's guess)."""
    import copy

    from kda.layer import KimiDeltaAttention

    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=256, num_heads=2, head_dim=128).cuda().to(torch.bfloat16)
    reference = copy.deepcopy(layer).cpu().double()
    x, x1 = torch.randn(2, 150, 256, device="cuda").bfloat16(), torch.randn(2, 1, 256, device="cuda").bfloat16()
    with torch.no_grad():
        y, cache = layer(x)
        y1, cache1 = layer(x1, cache, decode=True)
        ref_y, ref_cache = reference(x.cpu().double())
        ref_y1, ref_cache1 = reference(x1.cpu().double(), ref_cache, decode=True)
        prefill, step = torch.compile(layer, fullgraph=True), torch.compile(
            lambda x, cache: layer(x, cache, decode=True), fullgraph=True)
        got_y, got_cache = prefill(x)
        got_y1, got_cache1 = step(x1, got_cache)
    checks = (("prefill", got_y, y, ref_y), ("prefill state", got_cache.state, cache.state, ref_cache.state),
              ("decode", got_y1, y1, ref_y1), ("decode state", got_cache1.state, cache1.state, ref_cache1.state))
    for name, a, b, ref in checks:
        compiled, eager = (rel_l2(t.double().cpu(), ref.double()) for t in (a, b))
        assert torch.isfinite(a).all(), f"{name}: not finite"
        assert compiled <= 1.5 * eager + 1e-3, f"{name}: compiled {compiled:.1e} against float64, eager {eager:.1e}"
