"""The CUDA backward of chunk_kda and chunk_gated_delta_rule (``kda.backward``, marked ``gpu``):
every gradient of an eager CUDA call against autograd through the float64 token recurrence on the
same (rounded) inputs, bf16 and fp16, tails, packed sequences, gates down to -20, no NaN. The
switch is turned on here, whatever its default."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import backward as ref

from test_gpu_level5 import GATES, SHAPES, inputs

pytestmark = pytest.mark.gpu

# float32 stages on the rounded inputs, so the bound is the rounding of the gradient's own dtype
BOUND = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 5e-3}


@pytest.fixture
def device_backward(monkeypatch):
    from kda import backward

    monkeypatch.setattr(backward, "DEVICE_BACKWARD", True)


def gradients_on_cuda(fn, leaves, do, dht, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    o, final = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, **kwargs)
    loss = (o.float() * do).sum() + (final * dht).sum()
    return torch.autograd.grad(loss, leaves)


def check(got, want):
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert a.is_cuda and torch.isfinite(a).all(), f"{name}: not finite"
        assert rel_l2(a.double().cpu(), b) <= BOUND[a.dtype], f"{name}: {rel_l2(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_against_token_recurrence(shape, dtype, kind, per_channel, device_backward):
    leaves = inputs(shape, dtype, kind, per_channel, zlib.crc32(repr((shape, kind, "bwd")).encode()))
    B, T, H, DK, DV = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    do = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype).float()   # o's gradient arrives in o's dtype
    dht = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    got = gradients_on_cuda(fn, leaves, do, dht)
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    check(got, ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), DK ** -0.5, h0))


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_packed_sequences(per_channel, device_backward):
    """An empty sequence, one of length 1 and lengths not a multiple of 64, each with its state."""
    lengths = [0, 1, 63, 130, 200]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    T, H, DK, DV = sum(lengths), 2, 64, 128
    q, k, v, g, beta, _ = inputs((1, T, H, DK, DV), torch.bfloat16, "runs_of_-20", per_channel, 17)
    gen = torch.Generator(device="cuda").manual_seed(4)
    h0, dht = (torch.randn(len(lengths), H, DK, DV, generator=gen, device="cuda") for _ in range(2))
    do = torch.randn(1, T, H, DV, generator=gen, device="cuda").bfloat16().float()
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    got = gradients_on_cuda(fn, (q, k, v, g, beta, h0), do, dht, cu_seqlens=cu)
    want = ref.packed_backward(*(x.double().cpu() for x in (q, k, v, g, beta, do)), cu.cpu(),
                               dht.double().cpu(), DK ** -0.5, initial_state=h0.double().cpu())
    check(got, want)


def test_a_training_step_in_a_layer(device_backward):
    """A model's call (raw gate in the op, beta's sigmoid, L2 norm of q and k) trains: every
    parameter gets a finite gradient, and one step of SGD lowers the loss."""
    torch.manual_seed(0)
    B, T, H, D = 2, 300, 2, 64
    x = torch.randn(B, T, H * D, device="cuda")
    proj = torch.nn.Linear(H * D, 4 * H * D + 2 * H, device="cuda")
    A_log = torch.nn.Parameter(torch.log(torch.empty(H, device="cuda").uniform_(1, 16)))
    dt_bias = torch.nn.Parameter(torch.zeros(H * D, device="cuda"))
    params = [*proj.parameters(), A_log, dt_bias]

    def loss():
        q, k, v, g, b = proj(x).split([H * D, H * D, H * D, H * D, 2 * H], dim=-1)
        shape = (B, T, H, D)
        o, _ = kda.chunk_kda(q.reshape(shape).bfloat16(), k.reshape(shape).bfloat16(), v.reshape(shape).bfloat16(),
                             g.reshape(shape), b[..., :H], A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
        return (o.float() - v.reshape(shape).detach()).pow(2).mean()

    before = loss()
    grads = torch.autograd.grad(before, params)
    assert all(torch.isfinite(gr).all() and gr.abs().sum() > 0 for gr in grads)
    with torch.no_grad():
        for p, gr in zip(params, grads):
            p -= 0.05 * gr
    assert loss() < before


def test_off_switch_refuses_with_its_name(monkeypatch):
    from kda import backward

    monkeypatch.setattr(backward, "DEVICE_BACKWARD", False)
    q, k, v, g, beta, _ = inputs((1, 10, 2, 64, 64), torch.bfloat16, "logsigmoid", True, 5)
    q.requires_grad_()
    with pytest.raises(ValueError, match="kda.backward.DEVICE_BACKWARD = True"):
        kda.chunk_kda(q, k, v, g, beta)
