"""Run 160 (prepared 2026-12-07): GDN's split with a ragged last run read where it lies (``distributed.RAGGED_RUNS``).

Run 157 (H100) timed one sequence of 33,606 tokens (32 heads of 128, bf16) at 1.575 ms against 0.735 for 33,536: the
split padded q, k, v, g and beta to whole runs and copied o back (1.05 ms outside the kernels). With the switch on, the
passes take each sequence's runs as sequences of their own (``inverse_state_output_pass(runs=True)``) and the last
run short. This times the op off and on at lengths that are and are not whole runs (outputs on against off: the same
bits expected), each kernel by itself, and FlashQLA and fla's Triton GDN on the same inputs; then the short packed
cases of run 157 (the tiles, by default), whose host time per call (0.73 ms with 8,192 sequences) the boundaries'
checks kept per tensor should have cut. Rows to ``$OUT/run160.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run160-ragged-runs.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages, timed  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run160"
LENGTHS = (33536, 33606, 36924, 32768 + 1)

if __name__ == "__main__":
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

    from kda import distributed, gated_delta

    time_stages()
    q, k, v, g, beta = run140.dense_inputs(1, max(LENGTHS), 32, 128)
    for T in LENGTHS:
        inputs = [x[:, :T] for x in (q, k, v, g, beta)]
        case = f"(1, {T}, 32, 128)"
        outs = {}
        for on in (False, True):
            distributed.RAGGED_RUNS = on
            fn = lambda: gated_delta.chunk_gated_delta_rule(*inputs, output_final_state=True)
            impl = f"kda, ragged runs {'on' if on else 'off'}"
            timed(RUN, {"case": case, "impl": impl}, fn, describe=lambda o: outs.update({on: o}) or {})
            stage_times(RUN, {"case": case, "impl": impl, "what": "stages"}, fn)
        distributed.RAGGED_RUNS = False
        if len(outs) == 2:
            log(RUN, {"case": case, "same_bits": [torch.equal(a, b) for a, b in zip(outs[True], outs[False])],
                      "finite": all(bool(torch.isfinite(x).all()) for x in outs[True])})
        timed(RUN, {"case": case, "impl": "FlashQLA 0.1.3"},
              lambda: flash_qla.chunk_gated_delta_rule(*inputs, scale=128 ** -0.5)[0])
        timed(RUN, {"case": case, "impl": "fla Triton"}, lambda: fla_gdn(*inputs, scale=128 ** -0.5)[0])
        torch.cuda.empty_cache()
    for case, lens in run140.short_cases().items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        inputs = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        fn = lambda: gated_delta.chunk_gated_delta_rule(*inputs, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)[0]
        timed(RUN, {"case": case, "impl": "kda (tiles)"}, fn)
        stage_times(RUN, {"case": case, "impl": "kda (tiles)", "what": "stages"}, fn)
        timed(RUN, {"case": case, "impl": "FlashQLA 0.1.3"},
              lambda: flash_qla.chunk_gated_delta_rule(*inputs, scale=128 ** -0.5, cu_seqlens=cu)[0])
        torch.cuda.empty_cache()
