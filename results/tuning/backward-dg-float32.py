"""A CPU check (2026-12-03) behind the backward chapter's Section 3: float32 ``dg`` of
``kda.backward.op_gradients`` against the float64 recurrence, gates uniform in [-20, 0], 40 draws
for each of 1, 5 and 70 tokens (H = 2, K = V = 64), with the worst relative L2 error and how many
draws exceed 1e-4. Run it in a checkout of d2565f3 (the form that added, then took back, the
diagonal pairs and the decay to the chunk's end) and of 9dc3421 (the form that does not); both
outputs are in backward-dg-float32.txt.

    python results/tuning/backward-dg-float32.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from test_device_backward import F64, inputs  # noqa: E402

from kda import backward  # noqa: E402
from kda.metrics import rel_l2  # noqa: E402
from kda.reference import backward as ref  # noqa: E402

for per_channel in (False, True):
    for T in (1, 5, 70):
        errors = []
        for seed in range(40):
            gen = torch.Generator().manual_seed(seed)
            q, k, v, g, beta, h0, do, dht = inputs(B=1, T=T, H=2, K=64, V=64, seed=seed, per_channel=per_channel)
            g = -20 * torch.rand(g.shape, generator=gen, **F64)
            want = ref.recurrence_backward(q, k, v, g, beta, do, dht, 0.125, h0)[3]
            got = backward.op_gradients(q, k, v, g, beta, 0.125, h0, False, None, do, dht)[3]
            errors.append(rel_l2(got, want))
        print("KDA" if per_channel else "GDN", f"T={T}", f"worst {max(errors):.1e}",
              f"over 1e-4: {sum(e > 1e-4 for e in errors)} of 40")
