"""Run 130 (prepared 2026-12-06): CAPPED_STEPS (a steep chunk's diagonal blocks by one GEMM per score matrix about
each sub-chunk's middle row, every token's fall capped at 12 in log2) timed against the defaults (the halvings, and
the middles for safe_gate's form), KDA as a model calls it at the three level-5 shapes, fla's same call beside: the
plain call (mild gates) and the layer's calls (raw gate in bf16, beta's logits, raw keys, softplus form and
safe_gate's). Each kda row also kernel by kernel (``harness.stage_times``); ``against`` compares every output with the
first row's of its call. Rows to ``$OUT/run130.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run130-layer.py --warm

Environment: ``SHAPES_N`` (the first few shapes), ``CALLS`` (the calls whose name holds it, ``layer``: the layer's
two), ``STAGES=0`` (no stage tables), ``FLA=0`` (no fla rows).
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


def _run127():
    """run127-layer.py's shapes and calls (its name is not a module's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run127_layer", os.path.join(HERE, "run127-layer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SHAPES, module.calls


SHAPES, calls = _run127()

RUN = "run130"


def timed_call(name):
    """Whether the call ``name`` is timed: ``CALLS`` unset, or part of its name."""
    return os.environ.get("CALLS", "") in name


def warm_one(i, capped):
    import kda
    from kda.kernels import chunk_intra

    chunk_intra.CAPPED_STEPS = capped
    _, args, kw = calls(1, 512, 96, 128)[i]
    kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return i, capped


def warm():
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(6, mp_context=multiprocessing.get_context("spawn")) as pool:
        names = [call for call, _, _ in calls(1, 64, 1, 128)]
        jobs = [pool.submit(warm_one, i, c) for i, name in enumerate(names) if timed_call(name) for c in (False, True)]
        for done in futures.as_completed(jobs):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:
                print("warm failed:", repr(e)[:300], flush=True)


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.kernels import chunk_intra

    for shape in SHAPES[:int(os.environ.get("SHAPES_N", len(SHAPES)))]:     # SHAPES_N: the first few only
        for call, args, kw in calls(*shape):
            if not timed_call(call):
                continue
            first, row = [], {"shape": list(shape), "call": call}
            for capped in (False, True):
                chunk_intra.CAPPED_STEPS = capped
                ours = lambda: kda.chunk_kda(*args, **kw)[0]
                impl = "kda capped" if capped else "kda"
                harness.timed(RUN, {**row, "impl": impl}, ours, harness.against(first))
                if os.environ.get("STAGES", "1") == "1":                       # STAGES=0: the whole call only
                    harness.stage_times(RUN, {**row, "impl": impl + " stages"}, ours)
            if os.environ.get("FLA", "1") == "1":                              # FLA=0: kda's rows only
                harness.timed(RUN, {**row, "impl": "fla"}, lambda: fla_kda(*args, scale=shape[-1] ** -0.5, **kw)[0],
                              harness.against(first))
            first.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    harness.time_stages()
    main()
