"""Run 158 (prepared 2026-12-07): KDA on short packed sequences in tiles of whole sequences, timed
(``gated_delta.TILES_OF_SHORT_SEQUENCES``).

Issue 42 measured 1024 packed sequences of 1 to 64 tokens at 3.56 ms for KDA against 2.12 for the same tokens as one
sequence (H200). With the switch, level 5's chunks are tiles of whole sequences (696 instead of 1024 there; 598
instead of 8192 for 8192 sequences of 1 to 8 tokens). With ``STREAM_OF_CHUNKS`` (prepared the same day) the
packed tokens are one stream of chunks, the state reset where a sequence starts: 526 chunks there, and any lengths
(96 random lengths too). This times chunk_kda through the chunk table, the tiles and the stream (the outputs against
the chunk table's, relative L2), the same tokens as one sequence and fla's chunk_kda on the same packed call (32 heads
of 128, bf16, activated gates). Rows to ``$OUT/run158.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run158-kda-tiles.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages, timed  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run158"
FORMS = ("chunk table", "tiles", "stream")   # TILES_OF_SHORT_SEQUENCES, STREAM_OF_CHUNKS

if __name__ == "__main__":
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import gated_delta
    from kda.metrics import rel_l2

    time_stages()
    cases = {"96 random lengths": run140.lengths("96 random lengths"), **run140.short_cases()}
    for case, lens in cases.items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        q, k, v, _, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        g = torch.nn.functional.logsigmoid(torch.randn(*v.shape, device="cuda")) / 16
        outs = {}
        for form in FORMS if max(lens) <= 64 else ("chunk table", "stream"):
            gated_delta.TILES_OF_SHORT_SEQUENCES, gated_delta.STREAM_OF_CHUNKS = form == "tiles", form == "stream"
            fn = lambda: kda.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)[0]
            impl = f"kda, {form}"
            timed(RUN, {"case": case, "impl": impl}, fn, describe=lambda o: outs.update({form: o}) or {})
            if form in outs:
                stage_times(RUN, {"case": case, "impl": impl, "what": "stages"}, fn)
        gated_delta.TILES_OF_SHORT_SEQUENCES = gated_delta.STREAM_OF_CHUNKS = False
        for form in [f for f in outs if f != "chunk table" and "chunk table" in outs]:
            log(RUN, {"case": case, "form": form,
                      "rel_l2 vs chunk table": float(f"{rel_l2(outs[form], outs['chunk table']):.2e}"),
                      "finite": bool(torch.isfinite(outs[form]).all())})
        timed(RUN, {"case": case, "impl": "kda, the same tokens as one sequence"},
              lambda: kda.chunk_kda(q, k, v, g, beta)[0])
        timed(RUN, {"case": case, "impl": "fla chunk_kda"},
              lambda: fla_kda(q, k, v, g, beta, scale=128 ** -0.5, cu_seqlens=cu)[0])
        torch.cuda.empty_cache()
