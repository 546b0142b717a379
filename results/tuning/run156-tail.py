"""Run 156 (2026-12-07): GDN's dense op at T = 32768 and at T = 33606 (run 155's 1024 short sequences' tokens as one
sequence: 1.608 ms there against 0.752 at 32768 in run 152, H100), 32 heads of 128, bf16, stage by stage: is a T
that is not a whole number of the split's runs (padded, kda.distributed._pad_time) that much slower? Rows to
``$OUT/run156.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run156-tail.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run156"

if __name__ == "__main__":
    import flash_qla

    from kda import gated_delta
    from kda.bench import median_ms

    time_stages()
    for T in (32768, 33606, 33792):
        q, k, v, g, beta = run140.dense_inputs(1, T, 32, 128)
        fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta)[0]
        log(RUN, {"case": f"1x{T}x32x128", "impl": "kda", "ms": round(median_ms(fn), 4)})
        stage_times(RUN, {"case": f"1x{T}x32x128", "impl": "kda", "what": "stages"}, fn)
        fq = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5)[0]
        log(RUN, {"case": f"1x{T}x32x128", "impl": "FlashQLA 0.1.3", "ms": round(median_ms(fq), 4)})
