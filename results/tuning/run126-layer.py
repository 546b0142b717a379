"""Run 126 (prepared 2026-12-06): a layer's KDA call with the steep reload from what the first load kept
(``RELOAD_FROM_KEPT``: the parked cumulative gate, the kept inverse norms) and the activations by ex2 and lg2
(``FAST_ACTIVATIONS``), and safe_gate's form with ``MIDDLES_BY_ROWS`` (its tests passed in run 125), timed beside the
defaults and fla's same call. KDA at (1, 8192, 96, 128), bf16; the raw gate as float32 (as runs 121-125 gave it) and
as bf16 (as a model's projection gives it: its own shared-memory buffer, 127 KB in the default kernel, one block per
SM). Each row timed (``ms``), the kda rows kernel by kernel too (``harness.stage_times``). Rows to
``$OUT/run126.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run126-layer.py --warm   # each variant compiled in its own process first
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run126"
SWITCHES = ("RELOAD_FROM_KEPT", "FAST_ACTIVATIONS", "MIDDLES_BY_ROWS")


def calls(T):
    """(call, its arguments, keywords, [(variant, switches on)]) at (1, T, 96, 128)."""
    from kda.reference import level4 as ref

    B, H, D = 1, 96, 128
    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    layer = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 use_qk_l2norm_in_kernel=True)
    safe = dict(layer, safe_gate=True, lower_bound=-5.0)
    softplus32, softplus16 = (q * 3, k * 3, v, raw, logits), (q * 3, k * 3, v, raw.bfloat16(), logits)
    kept, fast = {"RELOAD_FROM_KEPT": True}, {"RELOAD_FROM_KEPT": True, "FAST_ACTIVATIONS": True}
    return [
        ("plain (mild gates)", (qn, kn, v, torch.nn.functional.logsigmoid(raw), torch.sigmoid(logits)), {},
         [("default", {}), ("kept", kept)]),
        ("layer call, softplus, raw gate float32", softplus32, layer,
         [("default", {}), ("kept", kept), ("kept, fast", fast)]),
        ("layer call, softplus, raw gate bf16", softplus16, layer, [("default", {}), ("kept, fast", fast)]),
        ("layer call, safe_gate, raw gate bf16", softplus16, safe,
         [("default", {}), ("middles by rows", {"MIDDLES_BY_ROWS": True}),
          ("middles by rows, kept, fast", {"MIDDLES_BY_ROWS": True, **fast})]),
    ]


def switched(on):
    from kda.kernels import chunk_intra

    for name in SWITCHES:
        setattr(chunk_intra, name, on.get(name, False))


def warm_one(which):
    """One call of variant ``which`` (call index, variant index) at T = 512: its kernels compiled into the caches."""
    import kda

    call, args, kw, variants = calls(512)[which[0]]
    switched(variants[which[1]][1])
    kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return which


def warm():
    import concurrent.futures as futures
    import multiprocessing

    todo = [(i, j) for i, (_, _, _, variants) in enumerate(calls(64)) for j in range(len(variants))]
    with futures.ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in futures.as_completed([pool.submit(warm_one, w) for w in todo]):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:       # the timing below meets the same error and logs it
                print("warm failed:", repr(e)[:300], flush=True)


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda

    D = 128
    for call, args, kw, variants in calls(8192):
        first = []
        for variant, on in variants:
            switched(on)
            try:
                ours = lambda: kda.chunk_kda(*args, **kw)[0]
                harness.timed(RUN, {"call": call, "impl": f"kda {variant}"}, ours, harness.against(first))
                harness.stage_times(RUN, {"call": call, "impl": f"kda {variant} stages"}, ours)
            finally:
                switched({})
        harness.timed(RUN, {"call": call, "impl": "fla"}, lambda: fla_kda(*args, scale=D ** -0.5, **kw)[0],
                      harness.against(first))


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    harness.time_stages()
    main()
