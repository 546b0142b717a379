"""A KDA layer's own kernels on the GPU (marked ``gpu``; ``kda.layer.LAYER_KERNELS``): the short causal convolution
with SiLU (``kda.kernels.causal_conv``) and the gated RMS norm of the output (``kda.kernels.norms``) against float64,
outputs poisoned with NaN, ragged tails; and the layer with them against the layer by torch, a prefill then decode
steps."""

import pytest
import torch

from kda.metrics import rel_l2

from test_layer import prefill_then_decode

pytestmark = pytest.mark.gpu


def conv_reference(x, weight, tail):
    """float64: ``silu`` of the depthwise causal convolution of ``x [B, T, C]``, ``tail [B, C, W - 1]`` before it."""
    B, _, C = x.shape
    W = weight.shape[-1]
    before = tail.double() if tail is not None else torch.zeros(B, C, W - 1, dtype=torch.float64, device=x.device)
    padded = torch.cat([before, x.double().transpose(1, 2)], dim=2)
    y = torch.nn.functional.conv1d(padded, weight.double().view(C, 1, W), groups=C)
    return torch.nn.functional.silu(y).transpose(1, 2)


@pytest.mark.parametrize("T", [1, 2, 37, 300])
@pytest.mark.parametrize("with_tail", [False, True], ids=["no_tail", "tail"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_conv_against_float64(dtype, with_tail, T, poisoned):
    from kda.kernels.causal_conv import causal_conv

    gen = torch.Generator(device="cuda").manual_seed(T)
    B, C, W = 2, 192, 4
    x = torch.randn(B, T, C, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(C, W, generator=gen, device="cuda") / 2
    tail = torch.randn(B, C, W - 1, generator=gen, device="cuda").to(dtype) if with_tail else None
    y = causal_conv(x, weight, tail)
    assert torch.isfinite(y).all()
    assert rel_l2(y, conv_reference(x, weight, tail)) <= 5e-3


@pytest.mark.parametrize("N", [1, 64, 777])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gated_rms_norm_against_float64(dtype, N, poisoned):
    from kda.kernels.norms import gated_rms_normalized

    gen = torch.Generator(device="cuda").manual_seed(N)
    o = (torch.randn(N, 3, 128, generator=gen, device="cuda") * 4).to(dtype)
    gate = torch.randn(N, 3, 128, generator=gen, device="cuda").to(dtype)
    weight = torch.rand(128, generator=gen, device="cuda") + 0.5
    y = gated_rms_normalized(o, gate, weight, 1e-6)
    od = o.double()
    want = od * torch.rsqrt(od.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double() * torch.sigmoid(gate.double())
    assert torch.isfinite(y).all() and rel_l2(y, want) <= 5e-3


def test_layer_with_its_kernels_equals_torchs(monkeypatch):
    """The bf16 layer with ``LAYER_KERNELS`` against the same layer by torch: one prefill, and a prefill followed by
    decode steps (the convolutions' tails carried); the conv tails bit for bit, the outputs and states within bf16's
    rounding."""
    from kda import layer as layer_module
    from kda.layer import KimiDeltaAttention

    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=256, num_heads=2, head_dim=128, num_v_heads=4).to("cuda", torch.bfloat16)
    x = torch.randn(2, 70, 256, device="cuda", dtype=torch.bfloat16)
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(layer_module, "LAYER_KERNELS", on)
        runs[on] = prefill_then_decode(layer, x, 64)
    (full, full_cache, stepped, cache), (full_k, full_cache_k, stepped_k, cache_k) = runs[False], runs[True]
    assert torch.isfinite(full_k).all() and torch.isfinite(stepped_k).all()
    assert rel_l2(full_k, full) <= 2e-2 and rel_l2(stepped_k, stepped) <= 2e-2
    assert rel_l2(stepped_k, full_k) <= 2e-2
    assert all(torch.equal(a, b) for a, b in zip(full_cache_k.conv, full_cache.conv))
    assert all(torch.equal(a, b) for a, b in zip(cache_k.conv, cache.conv))
    assert rel_l2(cache_k.state, cache.state) <= 2e-2
