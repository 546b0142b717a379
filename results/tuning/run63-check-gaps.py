"""Run 63 (H200, prepared): where the checked call of GDN loses its 0.2 ms.

The records of 221fa65 show the checked `chunk_gated_delta_rule` 0.19 to 0.22 ms above the
unchecked one (1.862 against 1.669 ms at (1, 32768, 32, 128); 1.432 against 1.214 at (1, 8192, 96,
128)), and the checked `chunk_kda` only 0.06 to 0.07 above its unchecked call. Both read the same
two flags back between the same two kernels (`chunk_intra`, then `gated_state_output_pass`).
Here torch.profiler records the GPU's kernels over ten back-to-back calls of each, checked and not,
and the gaps between them: after `chunk_intra` (the read-back and the launch of the pass), after
the pass (the next call's host work), and every other kernel the call launches (fills, copies).
One JSON line per (op, check) with the medians, and the kernel list of one call.

    python results/tuning/run63-check-gaps.py
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run63"


def timeline(call, n=10):
    """The CUDA kernels of ``n`` back-to-back calls, as (name, start_us, end_us), in order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type.name == "CUDA"]
    return sorted(kernels, key=lambda x: x[1])


def gaps(kernels, calls):
    """Medians over the calls, per position in a call (tilelang names every kernel ``main_kernel``,
    so the position tells them apart): the kernel's time and the idle time before it."""
    per_call = len(kernels) // calls
    out = []
    for p in range(per_call):
        took, idle = [], []
        for c in range(calls):
            i = c * per_call + p
            took.append(kernels[i][2] - kernels[i][1])
            if i > 0:
                idle.append(kernels[i][1] - kernels[i - 1][2])
        out.append({"position": p, "kernel": kernels[p][0][:60], "us": round(statistics.median(took), 1),
                    "idle_before_us": round(statistics.median(idle), 1) if idle else None})
    return out


def main():
    import torch

    from kda.bench import random_qkv
    from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
    from kda.reference import level4 as ref4
    for B, T, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v = random_qkv(B, T, H, D, D, seed=7)
        k = ref4.l2_normalize(k.float()).bfloat16()
        gen = torch.Generator(device="cuda").manual_seed(9)
        beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
        g_head = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
        g_channel = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
        for op, fn, g in (("GDN", chunk_gated_delta_rule, g_head), ("KDA", chunk_kda, g_channel)):
            for check in (True, False):
                kernels = timeline(lambda: fn(q, k, v, g, beta, check_values=check))
                log(RUN, {"op": op, "shape": [B, T, H, D], "check_values": check, "kernels": len(kernels),
                          "per_position": gaps(kernels, 10),
                          "wall_us_per_call": round((kernels[-1][2] - kernels[0][1]) / 10, 1)})


if __name__ == "__main__":
    main()
