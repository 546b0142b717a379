"""Run 93 (H200, prepared 2026-12-03, not yet run): what run 91's limiter was, tried. Run 91 timed
``kda.backward`` (torch stages in float32) at 883 ms for forward + backward of KDA at (1, 8192, 96,
128) against fla's 14.3 ms; its chunk stages made 95% of it, in 32 groups of 4 chunks, a few hundred
small launches per group. Since then ``SubChunked`` does every block of a chunk at once (half the
launches of the chunk stages) and the groups take a quarter of the free memory (``MEMORY_BUDGET =
None``: 4 groups there). For KDA and GDN at run 91's two shapes, forward + backward of one step, the
median of ``do_bench`` and the peak memory, for each variant of kda's backward:

* ``now``: the defaults;
* ``2 GiB``: ``MEMORY_BUDGET = 2 GiB``, run 91's groups (what the larger groups give);
* ``state kernels``: the defaults with ``STATE_KERNELS`` (its GPU tests passed in run 91, not timed);
* ``forward pieces``: the state passes' pieces by the forward's ``chunk_intra`` (``FORWARD_PIECES``);
* ``forward pieces, state kernels``: both;
* ``every kernel``: both and the chunk kernel (``CHUNK_KERNEL``; GDN only, KDA takes the torch chunk stage);

then fla (``FLA_FLASH_QLA=0``) and FlashQLA (GDN), and kda's stage split with the defaults.

    FLA_FLASH_QLA=0 python results/tuning/run93-backward.py
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run93"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
run91.RUN = RUN                                               # its stage split logs into this run's file


def variants():
    """(name, settings of kda.backward) in the order they are timed."""
    kernels = {"FORWARD_PIECES": True, "STATE_KERNELS": True}
    return [("now", {}), ("2 GiB", {"MEMORY_BUDGET": 2 << 30}), ("state kernels", {"STATE_KERNELS": True}),
            ("forward pieces", {"FORWARD_PIECES": True}), ("forward pieces, state kernels", kernels),
            ("every kernel", {**kernels, "CHUNK_KERNEL": True})]


def main():
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda import backward, cuda_autograd
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    cuda_autograd.DEVICE_BACKWARD = True
    for B, T, H, D in SHAPES:
        for op, per_channel in (("KDA", True), ("GDN", False)):
            leaves, do = run91.inputs(B, T, H, D, per_channel)
            scale = D ** -0.5
            ours = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
            fla_op = fla_kda if per_channel else fla_gdn
            peers = {"fla": lambda *a: fla_op(*a, scale=scale)}
            if not per_channel:
                peers["FlashQLA"] = lambda *a: flash_qla.chunk_gated_delta_rule(*a, scale=scale)
            want = None
            for name, fn in peers.items():
                run = run91.step(fn, leaves, do)
                got = run()
                want = want or got
                log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name,
                          "ms": round(median_ms(run, warmup_ms=200, rep_ms=1000), 3), "peak_MB": run91.peak_mb(run)})
            for name, settings in variants():
                saved = {key: getattr(backward, key) for key in settings}
                for key, value in settings.items():
                    setattr(backward, key, value)
                try:
                    run = run91.step(lambda *a: ours(*a), leaves, do)
                    got = run()
                    row = {"ms": round(median_ms(run, warmup_ms=200, rep_ms=2000), 3), "peak_MB": run91.peak_mb(run),
                           "rel_l2_vs_fla": {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                             for n, a, b in zip("q k v g beta".split(), got, want)}}
                except Exception as e:                   # a variant that fails says why, the others go on
                    row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                finally:
                    for key, value in saved.items():
                        setattr(backward, key, value)
                log(RUN, {"op": op, "B": B, "T": T, "H": H, "D": D, "impl": f"kda, {name}", **row})
            run91.stage_times(op, leaves, do, per_channel)
            del leaves, do, want
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
