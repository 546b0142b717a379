"""Run 161 (prepared 2026-12-07): where GDN's split spends the 0.32 ms that a ragged length still costs.

Run 160 (H100, 32 heads of 128, bf16) had the op at 0.741 ms for T = 33,536 (whole runs) and 1.060 for T = 33,606 with
``RAGGED_RUNS`` on, the kernels the same time at both lengths by ``stage_times``. This profiles both lengths (every
kernel and torch operation, the last call's launches in order, CPU and CUDA) into ``$OUT/run161-<T>.txt`` and times
each again beside the unsplit op (``SPLIT_IN_OP`` off). Rows to ``$OUT/run161.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run161-ragged-profile.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import OUT, profile, script, timed  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run161"

if __name__ == "__main__":
    from kda import gated_delta

    q, k, v, g, beta = run140.dense_inputs(1, 33606, 32, 128)
    for T in (33536, 33606):
        inputs = [x[:, :T] for x in (q, k, v, g, beta)]
        fn = lambda: gated_delta.chunk_gated_delta_rule(*inputs, output_final_state=True)
        timed(RUN, {"case": f"(1, {T}, 32, 128)", "impl": "kda, split"}, fn)
        profile(fn, os.path.join(OUT, f"{RUN}-{T}.txt"), title=f"GDN (1, {T}, 32, 128), split: ")
        gated_delta.SPLIT_IN_OP = False
        timed(RUN, {"case": f"(1, {T}, 32, 128)", "impl": "kda, unsplit"}, fn)
        gated_delta.SPLIT_IN_OP = True
