"""Run 151 (2026-12-07): is GDN's split op host-bound? At (1, 131072, 4, 128) run 151 timed the op at 0.677 ms with
its two kernels at 0.17 and 0.28 ms. For each case: the median of do_bench; the host's time per call when calls are
queued back to back (a loop of 50, then one synchronize: if it equals do_bench the host is the limit); the host's time
of one call from an idle GPU to its return (which includes the read back of the value flags); and the CPU time by
torch operation of 20 calls (torch.profiler, the 15 largest). Rows to ``$OUT/run151-host.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run151-host.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import host_times, log, script  # noqa: E402

run140 = script("run140-gdn.py")

SHAPES = [(1, 131072, 4, 128), (1, 32768, 32, 128), (1, 8192, 96, 128)]
if os.environ.get("REVERSE"):             # the shapes in the other order (run 152's first row was not explained)
    SHAPES = SHAPES[::-1]

if __name__ == "__main__":
    from kda import gated_delta
    from kda.bench import median_ms

    for B, T, H, D in SHAPES:
        q, k, v, g, beta = run140.dense_inputs(B, T, H, D)
        for checked in (True, False):
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, check_values=checked)
            fn()
            torch.cuda.synchronize()
            row = {"case": f"{B}x{T}x{H}x{D}", "check_values": checked, "do_bench_ms": round(median_ms(fn), 4)}
            row.update(host_times(fn))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
            row["cpu_self_us_per_call"] = {e.key[:60]: round(e.self_cpu_time_total / 20, 1) for e in ops}
            log("run151-host", row)
