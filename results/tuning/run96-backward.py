"""Run 96 (H200, prepared 2026-12-03, not yet run): the backward after 64718ae, which keeps q, k, v and
do in bf16 where the kernels take every step (GDN) and the forward's pieces in theirs. Forward +
backward of one step at run 91's two shapes, KDA and GDN, kda's defaults beside fla (``FLA_FLASH_QLA=0``)
and FlashQLA (GDN), and for KDA the three chunk kernels for a gate per channel (``CHUNK_KERNELS_BY_CHANNEL``,
off by default until this run's tests pass); then a profile of kda's GDN step at (1, 8192, 96, 128): the CUDA time of each kernel
and torch operation, so that the next change goes where the time is.

    FLA_FLASH_QLA=0 python results/tuning/run96-backward.py
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import OUT, log, profile  # noqa: E402

RUN = "run96"
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]


def main():
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import backward, cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    for op in ("KDA", "GDN"):            # KDA first: its new kernels decide a switch
        for B, T, H, D in SHAPES:
            per_channel = op == "KDA"
            leaves, do = run91.inputs(B, T, H, D, per_channel)
            scale = D ** -0.5
            impls = {"fla": lambda *a: (fla_kda if per_channel else fla_gdn)(*a, scale=scale)}
            if not per_channel:
                impls["FlashQLA"] = lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale)
            impls["kda"] = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
            if per_channel:                    # the three kernels for a gate per channel (off by default)
                impls["kda, kernels by channel"] = impls["kda"]
            want = None
            for name, fn in impls.items():
                backward.CHUNK_KERNELS_BY_CHANNEL = name == "kda, kernels by channel"
                run = run91.step(fn, leaves, do)
                try:
                    got = run()
                except Exception as e:                  # a variant that fails says why, the others go on
                    log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name,
                              "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    continue
                want = want or got
                log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name,
                          "ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), "peak_MB": run91.peak_mb(run),
                          "rel_l2_vs_fla": {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                            for n, a, b in zip("q k v g beta".split(), got, want)}})
            if op == "GDN" and (B, T, H, D) == SHAPES[0]:
                profile(run91.step(impls["kda"], leaves, do), os.path.join(OUT, "run96-gdn-profile.txt"))
            del leaves, do, want
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
