"""Run 159 (prepared 2026-12-07): level 5's tiles of short sequences against the chunk table, sequence by sequence.

Run 157's test_sequence_tiles_per_channel failed twice for bf16 KDA (logsigmoid and kda_style gates), one sequence
each at 5.1e-3 against the bound of 5e-3. This makes the test's inputs again and gives, for the tiles
(``TILES_OF_SHORT_SEQUENCES``) and for the chunk table, each sequence's relative L2 error against the float64
recurrence: the worst five of each and how many pass 5e-3. Rows to ``$OUT/run159.jsonl``.

    python results/tuning/run159-tile-errors.py
"""
import os
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
from harness import log  # noqa: E402

RUN = "run159"

if __name__ == "__main__":
    import random_inputs

    import kda
    from kda import gated_delta
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0

    gated_delta.SCALAR_GATE_PATH = False
    for kind in ("logsigmoid", "kda_style"):
        dtype, per_channel = torch.bfloat16, True
        gen = torch.Generator().manual_seed(97)
        lengths = torch.randint(0, 65, (150,), generator=gen).tolist() + [1, 0, 64, 1]
        T = sum(lengths)
        bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        cu = torch.tensor(bounds, device="cuda")
        seed = zlib.crc32(f"{kind}{dtype}{per_channel}".encode())
        q, k, v, g, beta = random_inputs.gated_delta(1, T, 4, 128, 128, gate="channel", form=kind, dtype=torch.float32,
                                                     cast=dtype, device="cuda", seed=seed)[:5]
        q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
        qr, kr = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
        refs = {}
        for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            if e > s:
                refs[n] = ref0.recurrent(qr[:, s:e].double() * 128 ** -0.5, kr[:, s:e], v[:, s:e], g[:, s:e],
                                         beta[:, s:e], torch.zeros(1, 4, 128, 128, device="cuda"), True)[0]
        for tiles in (False, True):
            gated_delta.TILES_OF_SHORT_SEQUENCES = tiles
            o, _ = kda.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
            errs = {n: rel_l2(o[:, bounds[n]:bounds[n + 1]], ref) for n, ref in refs.items()}
            worst = sorted(errs.items(), key=lambda x: -x[1])[:5]
            log(RUN, {"gate": kind, "tiles": tiles, "worst": [(n, bounds[n + 1] - bounds[n], f"{x:.2e}")
                                                              for n, x in worst],
                      "over 5e-3": sum(x > 5e-3 for x in errs.values()), "sequences": len(errs),
                      "whole": f"{rel_l2(o, torch.cat([refs[n] for n in sorted(refs)], 1)):.2e}"})
