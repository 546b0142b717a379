"""Run 100 (prepared 2026-12-04): where the backward's time goes, and the two switches that landed unverified. Runs 98 and 99 recorded forward + backward
at (1, 8192, 96, 128), bf16: KDA 37.9 ms against fla's 14.3, GDN 10.3 against FlashQLA's 2.27, and no split
of kda's step by kernel exists (run 96's profile never ran). This profiles one step of each with
``torch.profiler`` (CUDA time of every kernel and torch operation, three steps after one warm-up), beside
fla's KDA step and FlashQLA's GDN step for the same split of theirs, and writes each table to
``$OUT/run100-<name>.txt``, with every kernel launch of the last step in order (TileLang names most of its
kernels ``main_kernel``, which the table lumps together); a row per table in ``$OUT/run100.jsonl`` gives the
step's total CUDA time. First (``switches``), forward + backward of both ops with the defaults and with
``STATES_AS_OPERANDS``, ``TOKEN_MAJOR_STATES``, ``SHARED_PAIR_SUMS`` and ``GATE_IN_PAIR_KERNEL`` (landed off,
GPU tests in the same call) one at a time and together: time, peak memory and every gradient against the defaults'.

    FLA_FLASH_QLA=0 python results/tuning/run100-profile.py
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import OUT, log  # noqa: E402

RUN = "run100"
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
SHAPE = (1, 8192, 96, 128)


def profile(name, run):
    """``harness.profile`` of ``run`` to ``run100-<name>.txt``; its CUDA time per step logged."""
    ms = harness.profile(run, os.path.join(OUT, f"{RUN}-{name}.txt"), title=f"{name}: shape {SHAPE}, bf16, ")
    log(RUN, {"profile": name, "cuda_ms_per_step": round(ms, 3)})


def switches():
    """Forward + backward with each unverified switch, against the defaults (time, peak, gradients)."""
    import kda
    from kda import backward, cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    B, T, H, D = SHAPE
    for op in ("KDA", "GDN"):
        per_channel = op == "KDA"
        leaves, do = run91.inputs(B, T, H, D, per_channel)
        fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
        want = None
        everything = ("STATES_AS_OPERANDS", "TOKEN_MAJOR_STATES", "SHARED_PAIR_SUMS", "GATE_IN_PAIR_KERNEL")
        for on in ((), *((name,) for name in everything), everything):
            if not per_channel and set(on) & {"SHARED_PAIR_SUMS", "GATE_IN_PAIR_KERNEL"} and len(on) == 1:
                continue                                                 # KDA's alone
            for name in everything:
                setattr(backward, name, name in on)
            run = run91.step(fn, leaves, do)
            row = {"stage": "switches", "op": op, "on": list(on)}
            try:
                got = run()
                want = want or got
                row.update(ms=round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), peak_MB=run91.peak_mb(run),
                           rel_l2_vs_defaults={n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                               for n, a, b in zip("q k v g beta".split(), got, want)})
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(RUN, row)
        for name in everything:
            setattr(backward, name, False)
        del leaves, do, want
        torch.cuda.empty_cache()


def main():
    import flash_qla
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    B, T, H, D = SHAPE
    scale = D ** -0.5
    for op in ("KDA", "GDN"):
        per_channel = op == "KDA"
        leaves, do = run91.inputs(B, T, H, D, per_channel)
        ours = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
        theirs = (lambda *a: fla_kda(*a, scale=scale)) if per_channel else \
            (lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale))
        profile(f"kda-{op.lower()}", run91.step(ours, leaves, do))
        profile(f"kda-{op.lower()}-forward", lambda: ours(*(x.detach() for x in leaves)))
        profile(f"{'fla' if per_channel else 'flashqla'}-{op.lower()}", run91.step(theirs, leaves, do))
        del leaves, do
        torch.cuda.empty_cache()


if __name__ == "__main__":
    stages = sys.argv[1:] or ["switches", "profile"]
    if "switches" in stages:
        switches()
    if "profile" in stages:
        main()
