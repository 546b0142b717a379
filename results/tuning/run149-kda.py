"""Run 149, KDA (prepared 2026-12-07): the state pass with ``U``'s slots swizzled (``gated_state_pass.SWIZZLED_U``).

The chain of ``gated_state_output_pass`` makes ``V_new = U - W S`` reading ``U`` element by element from slots tilelang
keeps row by row (64-byte rows of 32 value columns: four-way bank conflicts in the compiled source), the reads that
held GDN's pass back (run 147). This times ``chunk_kda`` with the switch off and on, kernel by kernel, dense at the two
shapes of issue 15 and packed (96 random lengths), the outputs bit for bit, beside fla's ``chunk_kda``. Rows to
``$OUT/run149.jsonl``.

    python results/tuning/run149-kda.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run149"


def cases():
    for B, T, H, D in run140.SHAPES:
        yield f"KDA dense {B}x{T}x{H}x{D}", B, T, H, D, None
    lens = run140.lengths("96 random lengths")
    yield "KDA 96 random lengths", 1, sum(lens), 32, 128, torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(),
                                                                         device="cuda")


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import gated_state_pass

    time_stages()
    for case, B, T, H, D, cu in cases():
        q, k, v, _, beta = run140.dense_inputs(B, T, H, D)
        g = torch.nn.functional.logsigmoid(torch.randn(*k.shape, device="cuda"))
        outs = {}
        for swizzled in (False, True):
            gated_state_pass.SWIZZLED_U = swizzled
            fn = lambda: gated_delta.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
            outs[swizzled] = fn()
            row = {"case": case, "impl": f"kda swizzled_u={swizzled}"}
            log(RUN, {**row, "ms": round(median_ms(fn), 4)})
            stage_times(RUN, {**row, "what": "stages"}, fn)
        gated_state_pass.SWIZZLED_U = False
        log(RUN, {"case": case, "same_bits": [torch.equal(x, y) for x, y in zip(outs[False], outs[True])]})
        log(RUN, {"case": case, "impl": "fla chunk_kda",
                  "ms": round(median_ms(lambda: fla_kda(q, k, v, g, beta, scale=D ** -0.5, cu_seqlens=cu)[0]), 4)})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
