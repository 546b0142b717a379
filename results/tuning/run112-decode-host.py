"""Run 112 (prepared 2026-12-06): where the checked decode step's host time goes.

Run 111 timed KDA's decode step at batch 1 (H = 32, D = 128, bf16) at 0.0758 ms checked and 0.0078 unchecked, and the
same 0.0757 with the read of the checks deferred: the GPU waits on the host, so the checks' 0.068 ms is host work
(launches, allocations, Python). Here 400 checked steps and 400 unchecked ones run under cProfile after a warm-up,
each set's host seconds per step measured around it (the GPU synchronised before and after), and the functions with
the most own time printed, one JSON row each.

    python results/tuning/run112-decode-host.py
"""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run112"
STEPS = 400


def main():
    import torch

    from kda import fused_recurrent_kda
    from kda.bench import random_qkv
    from kda.reference import level4 as ref

    B, H, D = 1, 32, 128
    q, k, v = random_qkv(B, 1, H, D, D, seed=B)
    k = ref.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(2)
    g = torch.nn.functional.logsigmoid(torch.randn(B, 1, H, D, generator=gen, device="cuda"))
    beta = torch.rand(B, 1, H, generator=gen, device="cuda")
    h0 = torch.randn(B, H, D, D, generator=gen, device="cuda")
    for checked in (True, False):
        step = lambda: fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                           check_values=checked)
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        plain_us = (time.perf_counter() - t) / STEPS * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        prof.disable()
        log(RUN, {"what": "decode host", "checked": checked, "us_per_step": round(plain_us, 1)})
        stats = pstats.Stats(prof).stats
        rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:25]       # by own (total) time
        for (file, line, name), (cc, nc, tt, ct, _) in rows:
            log(RUN, {"what": "decode host fn", "checked": checked, "fn": f"{os.path.basename(file)}:{line}:{name}",
                      "calls_per_step": round(nc / STEPS, 2), "own_us": round(tt / STEPS * 1e6, 2),
                      "cum_us": round(ct / STEPS * 1e6, 2)})


if __name__ == "__main__":
    main()
