"""The KimiDeltaAttention layer (kda.layer) on the CPU in float64: a prefill by the chunked forward
followed by decode steps through the recurrent op (activations in the op) gives the outputs of one
prefill over all the tokens; grouped value heads; the cache carries the convolutions."""

import torch

from kda.layer import KimiDeltaAttention
from kda.metrics import rel_l2


def prefill_then_decode(layer, x, prefill):
    """The layer over ``x`` as one prefill, and as a prefill of the first ``prefill`` tokens followed by one decode
    step per token: (one prefill's output, its cache, the steps' outputs joined, their cache)."""
    with torch.no_grad():
        full, full_cache = layer(x)
        y, cache = layer(x[:, :prefill])
        pieces = [y]
        for t in range(prefill, x.shape[1]):
            y_t, cache = layer(x[:, t:t + 1], cache, decode=True)
            pieces.append(y_t)
    return full, full_cache, torch.cat(pieces, dim=1), cache


def test_prefill_then_decode_steps_equal_one_prefill():
    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=32, num_heads=2, head_dim=16, num_v_heads=4).double()
    x = torch.randn(2, 25, 32, dtype=torch.float64)
    full, full_cache, stepped, cache = prefill_then_decode(layer, x, 20)
    with torch.no_grad():
        two_prefills = torch.cat([layer(x[:, :11])[0], layer(x[:, 11:], layer(x[:, :11])[1])[0]], dim=1)
    assert rel_l2(stepped, full) < 1e-6                          # the cached state is float32
    assert rel_l2(cache.state, full_cache.state) < 1e-6          # float32 states
    assert rel_l2(two_prefills, full) < 1e-6                     # a prefill continued from a cache
    assert all(rel_l2(a, b) < 1e-12 for a, b in zip(cache.conv, full_cache.conv))   # the last conv inputs
