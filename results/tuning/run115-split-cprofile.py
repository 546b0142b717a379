"""Run 115 (prepared 2026-12-06): the host's share of the routed split, by function. Run 114 had the op routed through
the split (``SPLIT_IN_OP``) take 2.21 ms by ``do_bench`` at (1, 131072, 4, 128) GDN where its kernels take 0.85: the
host, not the GPU. ``cProfile`` over 40 calls of each case (the GPU synchronised around each), the functions by
cumulative and by own time to ``$OUT/run115-<case>.txt``; a row per case with the host's time per call to
``$OUT/run115.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run115-split-cprofile.py
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run115"
OUT = os.environ.get("OUT", "/tmp")


def main():
    from importlib import import_module

    import kda
    from kda import gated_delta

    inputs = import_module("run108-warmup").inputs
    for (B, T, H), op, routed in [((1, 131072, 4), "gdn", True), ((1, 32768, 32), "gdn", True),
                                  ((1, 32768, 32), "gdn", False), ((1, 131072, 4), "kda", True)]:
        q, k, v, beta, g_kda, g_gdn = inputs(B, T, H)
        g = g_kda if op == "kda" else g_gdn
        plain = kda.chunk_kda if op == "kda" else kda.chunk_gated_delta_rule
        gated_delta.SPLIT_IN_OP = routed
        for _ in range(5):
            plain(q, k, v, g, beta)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        host = 0.0
        for _ in range(40):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prof.enable()
            plain(q, k, v, g, beta)
            prof.disable()
            host += time.perf_counter() - t0
        torch.cuda.synchronize()
        gated_delta.SPLIT_IN_OP = False
        tag = f"{op}-{T}-{H}-{'routed' if routed else 'op'}"
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        with open(os.path.join(OUT, f"{RUN}-{tag}.txt"), "w") as f:
            f.write(text.getvalue())
        harness.log(RUN, {"stage": "split cprofile", "op": op, "B": B, "T": T, "H": H, "routed": routed,
                          "host_ms_per_call_profiled": round(host * 1e3 / 40, 3)})
        del q, k, v, beta, g_kda, g_gdn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
