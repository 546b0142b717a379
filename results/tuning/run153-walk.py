"""Run 153 (prepared 2026-12-07): the chunk kernels with the reverse walk's identities, timed.

``kda.backward.WALK_IDENTITIES`` compiles GDN's ``chunk_gradients`` and KDA's ``chunk_state_gradients`` with the
identities of ``kda.reference.backward.scalar_gate_reverse_walk``: ``V' = T X``, one ``Y = T^T dV'`` for ``dV`` and
``dW``, ``dA = -stril(Y V'^T)`` (15 GEMMs a chunk instead of 20 for GDN, 9 instead of 14 for KDA's state kernel). This
times forward + backward of both ops at (1, 8192, 96, 128) and (1, 32768, 32, 128), bf16, with the switch off and on,
kernel by kernel (``harness.stage_times``), the gradients on against off (relative L2), beside FlashQLA's GDN step and
fla's KDA step. Rows to ``$OUT/run153.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run153-walk.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log, script, stage_times, time_stages  # noqa: E402

run91 = script("run91-backward.py")

RUN = "run153"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]

if __name__ == "__main__":
    import flash_qla
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import backward, cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    time_stages()
    for B, T, H, D in SHAPES:
        for op in ("GDN", "KDA"):
            per_channel = op == "KDA"
            leaves, do = run91.inputs(B, T, H, D, per_channel)
            case = f"{op} {B}x{T}x{H}x{D}"
            fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
            grads = {}
            for on in (False, True):
                backward.WALK_IDENTITIES = on
                run = run91.step(fn, leaves, do)
                grads[on] = run()
                impl = f"kda, identities {'on' if on else 'off'}"
                log(RUN, {"case": case, "impl": impl, "ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3),
                          "peak_MB": run91.peak_mb(run)})
                stage_times(RUN, {"case": case, "impl": impl, "what": "stages"}, run)
            backward.WALK_IDENTITIES = False
            log(RUN, {"case": case, "rel_l2_on_vs_off": {n: float(f"{rel_l2(a.float(), b.float()):.2e}") for n, a, b in
                                                         zip("q k v g beta".split(), grads[True], grads[False])},
                      "finite": all(bool(torch.isfinite(x).all()) for x in grads[True])})
            scale = D ** -0.5
            theirs = (lambda *a: fla_kda(*a, scale=scale)) if per_channel else \
                (lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale))
            try:
                run = run91.step(theirs, leaves, do)
                log(RUN, {"case": case, "impl": "fla chunk_kda" if per_channel else "FlashQLA 0.1.3",
                          "ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), "peak_MB": run91.peak_mb(run)})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"case": case, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            del leaves, do, grads
            torch.cuda.empty_cache()
