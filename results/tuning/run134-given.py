"""Run 134 (prepared 2026-12-06): the capped steps for a gate given activated. ``CAPPED_STEPS`` is on for the layer's
softplus gate only (``CAPPED_STEPS_FOR``); a caller that activates a layer's gates itself and passes them to
``chunk_kda`` still takes the halvings. This times that call (``-exp(A_log) softplus(x + dt_bias)`` as float32,
unit keys, beta in [0, 1]) with the halvings and with the capped steps (``CAPPED_STEPS_FOR`` with ``None``), and the
mild call both ways, at the three level-5 shapes, fla's same call beside. Rows to ``$OUT/run134.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run134-given.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run134"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128), (4, 4096, 64, 128)]
FORMS = {"halvings": ("softplus",), "capped": (None, "softplus")}     # CAPPED_STEPS_FOR


def calls(B, T, H, D):
    """(call, arguments): a layer's gates activated by the caller, and mild gates."""
    from kda.reference import level4 as ref

    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    steep = -A_log.exp()[:, None] * torch.nn.functional.softplus(raw + dt_bias.view(H, D))
    beta = torch.sigmoid(logits)
    return [("a layer's gates, activated before", (qn, kn, v, steep, beta)),
            ("mild gates", (qn, kn, v, torch.nn.functional.logsigmoid(raw), beta))]


def warm_one(i, form):
    import kda
    from kda.kernels import chunk_intra

    chunk_intra.CAPPED_STEPS_FOR = FORMS[form]
    kda.chunk_kda(*calls(1, 512, 96, 128)[i][1])
    torch.cuda.synchronize()
    return i, form


def warm():
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in futures.as_completed([pool.submit(warm_one, i, f) for i in range(2) for f in FORMS]):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:
                print("warm failed:", repr(e)[:300], flush=True)


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.kernels import chunk_intra

    for shape in SHAPES:
        for call, args in calls(*shape):
            first, row = [], {"shape": list(shape), "call": call}
            for form, gates in FORMS.items():
                chunk_intra.CAPPED_STEPS_FOR = gates
                harness.timed(RUN, {**row, "impl": f"kda {form}"}, lambda: kda.chunk_kda(*args)[0],
                              harness.against(first))
            harness.timed(RUN, {**row, "impl": "fla"}, lambda: fla_kda(*args, scale=shape[-1] ** -0.5)[0],
                          harness.against(first))
            first.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    harness.time_stages()
    main()
