"""Run 95 (H200, 2026-12-03): what run 93 had no time left for. GDN's backward at run 91's two shapes
with the torch stages, with the state-pass kernels and the forward's pieces, and with the chunk kernel
for a gate per head too (the defaults since run 93, ``CHUNK_KERNEL`` on its GPU tests alone), beside
fla (``FLA_FLASH_QLA=0``) and FlashQLA; then KDA's defaults and fla at the second shape. Forward +
backward of one step, the median of ``do_bench``, the peak memory, the gradients against the first
peer's.

    FLA_FLASH_QLA=0 python results/tuning/run95-backward.py
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run95"
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
OFF = {"FORWARD_PIECES": False, "STATE_KERNELS": False, "CHUNK_KERNEL": False}
VARIANTS = [("defaults", {}), ("no chunk kernel", {"CHUNK_KERNEL": False}), ("torch stages", OFF)]
CASES = [("GDN", (1, 8192, 96, 128), VARIANTS), ("GDN", (1, 32768, 32, 128), VARIANTS),
         ("KDA", (1, 32768, 32, 128), VARIANTS[:1])]


def main():
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import backward, cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    for op, (B, T, H, D), variants in CASES:
        per_channel = op == "KDA"
        leaves, do = run91.inputs(B, T, H, D, per_channel)
        scale = D ** -0.5
        peers = {"fla": lambda *a: (fla_kda if per_channel else fla_gdn)(*a, scale=scale)}
        if not per_channel:
            peers["FlashQLA"] = lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale)
        ours = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
        want = None
        for name, fn in [*peers.items(), *((f"kda, {v}", (ours, s)) for v, s in variants)]:
            settings = {}
            if isinstance(fn, tuple):
                fn, settings = fn
            saved = {key: getattr(backward, key) for key in settings}
            for key, value in settings.items():
                setattr(backward, key, value)
            try:
                run = run91.step(fn, leaves, do)
                got = run()
                want = want or got
                row = {"ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), "peak_MB": run91.peak_mb(run),
                       "rel_l2_vs_fla": {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                         for n, a, b in zip("q k v g beta".split(), got, want)}}
            except Exception as e:                      # a variant that fails says why, the others go on
                row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            finally:
                for key, value in saved.items():
                    setattr(backward, key, value)
            log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name, **row})
        del leaves, do, want
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
