"""The KimiDeltaAttention layer (kda.layer) on the CPU in float64: a prefill by the chunked forward
followed by decode steps through the recurrent op (activations in the op) gives the outputs of one
prefill over all the tokens; grouped value heads; the cache carries the convolutions."""

import torch

from kda.layer import KimiDeltaAttention
from kda.metrics import rel_l2


def test_prefill_then_decode_steps_equal_one_prefill():
    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden_size=32, num_heads=2, head_dim=16, num_v_heads=4).double()
    x = torch.randn(2, 25, 32, dtype=torch.float64)
    with torch.no_grad():
        full, full_cache = layer(x)
        y, cache = layer(x[:, :20])
        pieces = [y]
        for t in range(20, 25):
            y_t, cache = layer(x[:, t:t + 1], cache, decode=True)
            pieces.append(y_t)
        two_prefills = torch.cat([layer(x[:, :11])[0], layer(x[:, 11:], layer(x[:, :11])[1])[0]], dim=1)
    assert rel_l2(torch.cat(pieces, dim=1), full) < 1e-6           # the cached state is float32
    assert rel_l2(cache.state, full_cache.state) < 1e-6          # float32 states
    assert rel_l2(two_prefills, full) < 1e-6                     # a prefill continued from a cache
    assert all(rel_l2(a, b) < 1e-12 for a, b in zip(cache.conv, full_cache.conv))   # the last conv inputs
