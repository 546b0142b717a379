"""Run 155 (prepared 2026-12-07): short packed sequences in tiles of whole sequences, timed.

Run 151 (H100) had GDN on 1024 packed sequences of 1 to 64 tokens at 1.89 ms against 0.77 for the same tokens as
one sequence (issue 15's goal: within 1.15x): every sequence gets a chunk of its own and goes through the sequential
pass. ``scalar_gate.PACKED_TILES`` sends packed sequences of at most one chunk each with no states through
``packed_tile_output``: tiles of whole sequences, the whole forward in one kernel. This times the op with the switch
off and on (the outputs against each other, relative L2), the same tokens as one sequence, FlashQLA and fla's Triton
GDN, on run 140's 1024 short sequences and on run 144's 8192 sequences of 1 to 8 tokens (32 heads of 128, bf16). Rows
to ``$OUT/run155.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run155-tiles.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run155"

if __name__ == "__main__":
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.metrics import rel_l2

    assert os.environ.get("FLA_FLASH_QLA") == "0"
    time_stages()
    for case, lens in run140.short_cases().items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        q, k, v, g, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        D = q.shape[-1]
        outs = {}
        for on in (False, True):
            scalar_gate.PACKED_TILES = on
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)[0]
            outs[on] = fn()
            impl = f"kda, packed tiles {'on' if on else 'off'}"
            log(RUN, {"case": case, "impl": impl, "ms": round(median_ms(fn), 4)})
            stage_times(RUN, {"case": case, "impl": impl, "what": "stages"}, fn)
        scalar_gate.PACKED_TILES = False
        log(RUN, {"case": case, "rel_l2 on vs off": float(f"{rel_l2(outs[True], outs[False]):.2e}"),
                  "finite": bool(torch.isfinite(outs[True]).all())})
        one = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta)[0]
        peers = {"kda, the same tokens as one sequence": one,
                 "FlashQLA 0.1.3": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5,
                                                                            cu_seqlens=cu)[0],
                 "fla Triton": lambda: fla_gdn(q, k, v, g, beta, scale=D ** -0.5, cu_seqlens=cu)[0]}
        for impl, fn in peers.items():
            try:
                log(RUN, {"case": case, "impl": impl, "ms": round(median_ms(fn), 4)})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"case": case, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        torch.cuda.empty_cache()
