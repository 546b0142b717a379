"""Run 66 (H200, prepared): why level 4's checked call pays 0.086 ms where level 5's pays 0.036.

Run 65 (branch ``l4-beta-flag``): with ``beta`` checked inside ``chunk_wy`` and one flag read back
between the kernels, the pass made ready before the read-back, ``delta_rule`` took 1.546 ms checked
against 1.460 unchecked at (1, 32768, 32, 128), as with the ``aminmax`` read-back before both
kernels; GDN and KDA, the same read-back between their two kernels, 0.036 ms. Here run 63's
torch.profiler timeline (ten back-to-back calls; per kernel position the median time and the GPU's
idle time before it) for ``delta_rule`` and level 3's scalar ``gated_attention``, checked and not,
with ``beta`` in float32 and in bf16, beside GDN for comparison.

    python results/tuning/run66-level4-check-gap.py
"""
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, log, scalar_gates  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run66"


def run63():
    spec = importlib.util.spec_from_file_location("run63", os.path.join(os.path.dirname(__file__), "run63-check-gaps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    import torch

    import kda
    from kda.bench import random_qkv
    from kda.reference import level4 as ref4

    r63 = run63()
    B, T, H, D = 1, 32768, 32, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=66)
    k = ref4.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(67)
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    g = scalar_gates(B, T, H, "logsigmoid", seed=68)
    ops = {"delta_rule, beta float32": lambda check: kda.delta_rule(q, k, v, beta, check_values=check),
           "delta_rule, beta bf16": lambda check: kda.delta_rule(q, k, v, beta.bfloat16(), check_values=check),
           "level 3 scalar": lambda check: kda.gated_attention(q, k, v, g, check_values=check),
           "GDN": lambda check: kda.chunk_gated_delta_rule(q, k, v, g / 16, beta, check_values=check)[0]}
    for op, fn in ops.items():
        for check in (True, False):
            try:
                kernels = r63.timeline(lambda: fn(check))
                log(RUN, {"op": op, "shape": [B, T, H, D], "check_values": check, "kernels": len(kernels),
                          "per_position": r63.gaps(kernels, 10),
                          "wall_us_per_call": round((kernels[-1][2] - kernels[0][1]) / 10, 1)})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"op": op, "check_values": check, "error": repr(e)[-400:]})


if __name__ == "__main__":
    main()
