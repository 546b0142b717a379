"""Run 157 (prepared 2026-12-07): packed_tile_output's arrangements, timed (``scalar_gate.PACKED_TILE_CONFIG``).

Run 155 (H100) had the tiles' one kernel at 1.374 ms for 1024 sequences of 1 to 64 tokens (32 heads of 128, bf16)
against 0.574 + 0.843 for the inverse and the pass over a chunk per sequence: two blocks per SM, one tile each, every
load waited for. ``early_scores`` spends q's and k's tiles before the solve (70 KB of shared memory: three blocks per
SM); ``tiles_per_block`` loops over tiles with the next one's loads in flight. This times the op with each (outputs
against the default's, relative L2) on run 155's two cases, and the same tokens as one sequence at T padded to whole
chunks and not. Rows to ``$OUT/run157.jsonl``. (After this run ``tiles_per_block`` was taken out of the factory: wrong
outputs and no gain.)

    FLA_FLASH_QLA=0 python results/tuning/run157-tiles.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run157"
CONFIGS = {"default": {}, "early_scores": dict(early_scores=True),
           "4 tiles a block": dict(early_scores=True, tiles_per_block=4),
           "4 tiles a block, 2 stages": dict(early_scores=True, tiles_per_block=4, num_stages=2)}

if __name__ == "__main__":
    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.metrics import rel_l2

    time_stages()
    scalar_gate.PACKED_TILES = True
    for case, lens in run140.short_cases().items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        q, k, v, g, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        outs = {}
        for name, config in CONFIGS.items():
            scalar_gate.PACKED_TILE_CONFIG = config
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)[0]
            try:
                outs[name] = fn()
                log(RUN, {"case": case, "impl": f"kda tiles, {name}", "ms": round(median_ms(fn), 4),
                          "rel_l2 vs default": float(f"{rel_l2(outs[name], outs['default']):.2e}"),
                          "finite": bool(torch.isfinite(outs[name]).all())})
                stage_times(RUN, {"case": case, "impl": f"kda tiles, {name}", "what": "stages"}, fn)
            except Exception as e:  # noqa: BLE001
                log(RUN, {"case": case, "impl": f"kda tiles, {name}", "error": f"{type(e).__name__}: {str(e)[:200]}"})
        scalar_gate.PACKED_TILE_CONFIG = {}
        T = int(cu[-1])
        for length in (T, T // 256 * 256):
            one = lambda: gated_delta.chunk_gated_delta_rule(q[:, :length], k[:, :length], v[:, :length],
                                                             g[:, :length], beta[:, :length])[0]
            row = {"case": case, "impl": f"kda, one sequence of {length} tokens"}
            log(RUN, {**row, "ms": round(median_ms(one), 4)})
            stage_times(RUN, {**row, "what": "stages"}, one)
        torch.cuda.empty_cache()
