"""Run 114 (prepared 2026-12-06): where the intra-card split's fixed cost goes. Runs 108 and 112 had every split pay
a cost its passes do not explain (at (1, 32768, 4, 128) GDN 0.90 to 1.79 ms split against 0.67 unsplit). For each
case, bf16, logsigmoid gates, unit keys: the median of ``do_bench`` (``ms``, the L2 flushed before each call), the
wall time per call of 30 calls queued back to back (``wall_ms``: the host's time where it is the longer), the GPU
time per call by ``torch.profiler`` (``gpu_ms``) and the number of launches; every launch in order to
``$OUT/run114-<case>.txt``. Rows to ``$OUT/run114.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run114-split-host.py
"""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = os.environ.get("RUN", "run114")
OUT = os.environ.get("OUT", "/tmp")


def wall_ms(fn, calls=30):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / calls


def main():
    import kda
    from kda import distributed, gated_delta

    sys.path.insert(0, HERE)
    from importlib import import_module

    inputs = import_module("run108-warmup").inputs
    cases = [((1, 32768, 32), "gdn"), ((1, 32768, 4), "gdn"), ((1, 131072, 4), "gdn"), ((1, 32768, 32), "kda"),
             ((1, 8192, 96), "gdn"), ((1, 131072, 4), "kda")]
    if os.environ.get("CASES"):
        cases = [cases[int(i)] for i in os.environ["CASES"].split(",")]
    for (B, T, H), op in cases:
        q, k, v, beta, g_kda, g_gdn = inputs(B, T, H)
        g = g_kda if op == "kda" else g_gdn
        plain = kda.chunk_kda if op == "kda" else kda.chunk_gated_delta_rule
        first = []

        def routed(on):
            def call():
                gated_delta.SPLIT_IN_OP = on
                try:
                    return plain(q, k, v, g, beta)[0]
                finally:
                    gated_delta.SPLIT_IN_OP = False
            return call

        impls = [("op", routed(False)), ("op, SPLIT_IN_OP", routed(True))]
        if op == "gdn":
            distributed.SCALAR_GATE_SPLIT = True
            impls += [("split_forward scalar-gate, 4", lambda: distributed.split_forward(q, k, v, g, beta, 4)[0])]
        for name, fn in impls:
            row = {"stage": "split host", "op": op, "B": B, "T": T, "H": H, "impl": name}
            harness.timed(RUN, row, fn, harness.against(first))
            if "error" in row:
                continue
            row = dict(row, stage="split host, wall", wall_ms=round(wall_ms(fn), 3))
            tag = f"{op}-{T}-{H}-{name.split(',')[0].replace(' ', '_')}{'-routed' if 'SPLIT' in name else ''}"
            row["gpu_ms"] = round(harness.profile(fn, os.path.join(OUT, f"{RUN}-{tag}.txt"), title=f"{row}\n"), 3)
            with open(os.path.join(OUT, f"{RUN}-{tag}.txt")) as f:
                row["launches"] = sum(1 for line in f.read().split("in order (us):\n", 1)[1].splitlines() if line)
            harness.log(RUN, row)
        distributed.SCALAR_GATE_SPLIT = False
        del q, k, v, beta, g_kda, g_gdn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
