"""Run 91 (H200, prepared 2026-12-03, not yet run): the first CUDA backward (``kda.backward``, torch
stages in float32) timed against fla and FlashQLA, forward + backward of one step.

For KDA (``chunk_kda``, per-channel gate) and GDN (``chunk_gated_delta_rule``, a gate per head) at
(1, 32768, 32, 128) and (1, 8192, 96, 128), bf16, unit keys, ``logsigmoid`` gates, ``beta`` in
[0, 1]: the median of ``do_bench`` over ``torch.autograd.grad`` of ``sum(o * do)`` with respect to q,
k, v, g and beta (forward included), the peak memory of one step, and every gradient against fla's
(rel L2). fla is its own Triton path (``FLA_FLASH_QLA=0``); FlashQLA 0.1.3 for GDN. kda's backward
is also split into its stages (pieces, state passes, gradients) with CUDA events, to name the
limiter for the kernels that will replace them.

    FLA_FLASH_QLA=0 python results/tuning/run91-backward.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run91"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]


def inputs(B, T, H, D, per_channel, seed=7):
    from kda.reference import level4 as ref4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
    k = ref4.l2_normalize(torch.randn(B, T, H, D, generator=gen, device="cuda")).bfloat16()
    v = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, *([D] if per_channel else []), generator=gen,
                                                   device="cuda"))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    do = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
    return [x.requires_grad_() for x in (q, k, v, g, beta)], do


def step(fn, leaves, do):
    return lambda: torch.autograd.grad(fn(*leaves)[0], leaves, do)


def peak_mb(run):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2 ** 20)


def main():
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    for B, T, H, D in SHAPES:
        for op, per_channel in (("KDA", True), ("GDN", False)):
            leaves, do = inputs(B, T, H, D, per_channel)
            scale = D ** -0.5
            if per_channel:                          # fla first: the others' gradients are compared with its
                peers = {"fla": lambda *a: fla_kda(*a, scale=scale),
                         "kda": lambda *a: kda.chunk_kda(*a)}
            else:
                peers = {"fla": lambda *a: fla_gdn(*a, scale=scale),
                         "kda": lambda *a: kda.chunk_gated_delta_rule(*a),
                         "FlashQLA": lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale)}
            grads = {}
            for name, fn in peers.items():
                run = step(fn, leaves, do)
                try:
                    grads[name] = run()
                    row = {"ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), "peak_MB": peak_mb(run),
                           "forward_ms": round(median_ms(lambda: fn(*leaves)), 3)}
                except Exception as e:              # a peer without a backward for this form: say so
                    row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                if name in grads and "fla" in grads and name != "fla":
                    row["rel_l2_vs_fla"] = {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                            for n, a, b in zip("q k v g beta".split(), grads[name], grads["fla"])}
                log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name, **row})
            stage_times(op, leaves, do, per_channel)
            del leaves, do, grads
            torch.cuda.empty_cache()


def stage_times(op, leaves, do, per_channel):
    """kda's backward by stage: the op's backward with each stage of kda.backward timed by events."""
    from kda import backward
    from kda.reference import backward as stages

    times = {}
    originals = {name: getattr(stages, name) for name in ("chunk_pieces", "forward_states", "reverse_state_pass",
                                                          "chunk_gradients")}

    def timed(name, fn):
        def run(*a, **kw):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*a, **kw)
            end.record()
            torch.cuda.synchronize()
            times[name] = times.get(name, 0.0) + start.elapsed_time(end)
            return out
        return run

    for name, fn in originals.items():
        setattr(stages, name, timed(name, fn))
    try:
        q, k, v, g, beta = (x.detach() for x in leaves)
        with torch.no_grad():                               # as the op's backward runs: no graph recorded
            backward.op_gradients(q, k, v, g, beta, q.shape[-1] ** -0.5, None, False, None, do, None)
    finally:
        for name, fn in originals.items():
            setattr(stages, name, fn)
    log(RUN, {"op": op, "T": leaves[0].shape[1], "H": leaves[0].shape[2], "what": "kda backward stages (ms)",
              **{name: round(ms, 2) for name, ms in times.items()}})


if __name__ == "__main__":
    main()
