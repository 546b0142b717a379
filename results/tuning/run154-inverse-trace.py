"""Run 154 (prepared 2026-12-07): GDN's first kernel traced, stage by stage, chunk by chunk.

``chunk_gated_inverse`` takes 0.21 ms at (1, 8192, 96, 128) and 0.31 at (1, 32768, 32, 128) on an H100 (run 151),
40% of GDN's op, about 2.5 times its bytes' time (K read, Tb written). Compiled with ``trace=True`` it writes the SM's
clock at the points of ``scalar_gate.INVERSE_TRACE_EVENTS`` of every chunk into ``G`` (the kernel's four chunks a
block one after another). This prints, at both shapes, the median over blocks and chunks of each stage's cycles (one
stamp to the next), a chunk's period (one chunk's start to the next one's in the same block), and the kernel's time
with and without the stamps. Rows to ``$OUT/run154.jsonl``.

    python results/tuning/run154-inverse-trace.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run154"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]

if __name__ == "__main__":
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.kernels.scalar_gate import INVERSE_TRACE_EVENTS

    config = {**scalar_gate.SCALAR_GATE_INVERSE_CONFIG, **scalar_gate.COMPACT_INVERSE}
    per_block = config.get("chunks_per_block", 4)
    for B, T, H, D in SHAPES:
        q, k, v, g, beta = run140.dense_inputs(B, T, H, D)
        beta = beta.bfloat16()
        NC = -(-T // 64)
        table = torch.empty(1, 1, dtype=torch.int32, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        Tb = torch.empty(B, T, H, 64, dtype=torch.bfloat16, device="cuda")
        case = f"{B}x{T}x{H}x{D}"
        for traced in (False, True):
            kernel = compile_program(scalar_gate.chunk_gated_inverse, (), DK=D, dtype="bfloat16", beta_dtype="bfloat16",
                                     **config, **({"trace": True} if traced else {}))
            G = torch.full((B, H, NC * 64), -1.0, device="cuda")
            run = lambda: kernel(k, g, beta, G, Tb, flags, table)
            log(RUN, {"case": case, "traced": traced, "ms": round(median_ms(run), 4)})
        run()
        torch.cuda.synchronize()
        stamps = G.view(B, H, NC, 64)[..., :len(INVERSE_TRACE_EVENTS)].double()
        stages = stamps[..., 1:] - stamps[..., :-1]
        full = NC // per_block * per_block                      # blocks of whole chunk groups only
        starts = stamps[:, :, :full, 0].reshape(B, H, -1, per_block)
        period = (starts[..., 1:] - starts[..., :-1]).flatten()
        log(RUN, {"case": case, "cycles": {f"{INVERSE_TRACE_EVENTS[e]} -> {INVERSE_TRACE_EVENTS[e + 1]}":
                                           float(stages[..., e].median()) for e in range(stages.shape[-1])},
                  "chunk period": float(period.median()), "first chunk done": float(stamps[..., 0, -1].median()),
                  "written": bool((stamps >= 0).all())})
