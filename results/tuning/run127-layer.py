"""Run 127 (prepared 2026-12-06): KDA as a model calls it, with the defaults of run 126's switches (RELOAD_FROM_KEPT,
FAST_ACTIVATIONS for bf16, MIDDLES_BY_ROWS: on), at the three level-5 shapes, beside fla's same calls: the plain call
(mild gates, unit keys, beta in [0, 1]) and the layer's calls (the raw gate in bf16 as a projection gives it, beta's
logits, raw keys with the norm in the kernel; softplus form, and safe_gate's with lower_bound -5). Each kda row also
kernel by kernel (``harness.stage_times``). Rows to ``$OUT/run127.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run127-layer.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run127"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128), (4, 4096, 64, 128)]


def calls(B, T, H, D):
    """(call, its arguments, keywords) at (B, T, H, D)."""
    from kda.reference import level4 as ref

    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    layer = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 use_qk_l2norm_in_kernel=True)
    raw16 = (q * 3, k * 3, v, raw.bfloat16(), logits)
    return [("plain (mild gates)", (qn, kn, v, torch.nn.functional.logsigmoid(raw), torch.sigmoid(logits)), {}),
            ("layer call, softplus", raw16, layer),
            ("layer call, safe_gate", raw16, dict(layer, safe_gate=True, lower_bound=-5.0))]


def warm_one(i):
    import kda

    _, args, kw = calls(1, 512, 96, 128)[i]
    kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return i


def warm():
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in futures.as_completed([pool.submit(warm_one, i) for i in range(3)]):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:
                print("warm failed:", repr(e)[:300], flush=True)


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda

    for shape in SHAPES:
        for call, args, kw in calls(*shape):
            first, row = [], {"shape": list(shape), "call": call}
            ours = lambda: kda.chunk_kda(*args, **kw)[0]
            harness.timed(RUN, {**row, "impl": "kda"}, ours, harness.against(first))
            harness.stage_times(RUN, {**row, "impl": "kda stages"}, ours)
            harness.timed(RUN, {**row, "impl": "fla"}, lambda: fla_kda(*args, scale=shape[-1] ** -0.5, **kw)[0],
                          harness.against(first))
            first.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    harness.time_stages()
    main()
