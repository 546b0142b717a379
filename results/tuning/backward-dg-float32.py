"""A CPU check (2026-12-03) behind the backward chapter's Section 3: float32 ``dg`` of
``kda.backward.op_gradients`` against the float64 recurrence, gates uniform in [-20, 0], 40 draws
for each of 1, 5 and 70 tokens (H = 2, K = V = 64), with the worst relative L2 error and how many
draws exceed 1e-4. Run it in a checkout of d2565f3 (the form that added, then took back, the
diagonal pairs and the decay to the chunk's end; copy this script and tests/test_device_backward.py
into it) and of 9dc3421 or later (the form that does not); both outputs are in backward-dg-float32.txt.
The draws are the test's (``strong_gate_dg_errors``), twice as many.

    python results/tuning/backward-dg-float32.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from test_device_backward import strong_gate_dg_errors  # noqa: E402

for per_channel in (False, True):
    for T in (1, 5, 70):
        errors = strong_gate_dg_errors(T, per_channel, 40)
        print("KDA" if per_channel else "GDN", f"T={T}", f"worst {max(errors):.1e}",
              f"over 1e-4: {sum(e > 1e-4 for e in errors)} of 40")
