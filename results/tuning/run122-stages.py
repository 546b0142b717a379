"""Run 122 (prepared 2026-12-06): where the time goes, kernel by kernel (``harness.stage_times``), in the two calls
run 121 left far from their peers. ``layer``: KDA at (1, 8192, 96, 128), bf16: the plain call (logsigmoid gates,
unit keys, beta in [0, 1]); the same kernels on a layer's gates activated beforehand (``-exp(A_log) softplus(x +
dt_bias)``, beta's sigmoid, unit keys); the layer's call (raw gate, ``A_log``, ``dt_bias``, beta's logits, the L2 norm
in the op), softplus and safe_gate's forms; each timed beside fla's same call. ``gva``: GDN split at (1, 32768, 32)
against the grouped (1, 32768, 16 / 32), whose split took 1.50 ms in run 121 against 0.958 ungrouped in run 118.
Rows to ``$OUT/run122.jsonl``; a torch profile of the layer's call to ``$OUT/run122-layer.txt``.

    FLA_FLASH_QLA=0 python results/tuning/run122-stages.py [layer] [gva]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run122"


def layer():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.reference import level4 as ref

    B, T, H, D = 1, 8192, 96, 128
    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    mild = torch.nn.functional.logsigmoid(raw)
    beta01 = torch.sigmoid(logits)
    layer_g = -A_log.exp()[:, None] * torch.nn.functional.softplus(raw + dt_bias.reshape(H, D))
    calls = {
        "plain (mild gates)": ((qn, kn, v, mild, beta01), {}),
        "layer's gates, activated before": ((qn, kn, v, layer_g, beta01), {}),
        "layer call, softplus": ((q * 3, k * 3, v, raw, logits),
                                 dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                                      use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)),
        "layer call, safe_gate": ((q * 3, k * 3, v, raw, logits),
                                  dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                                       use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True,
                                       safe_gate=True, lower_bound=-5.0)),
    }
    for name, (args, kw) in calls.items():
        first = []
        row = lambda **more: {"stage": "layer", "call": name, **more}
        ours = lambda: kda.chunk_kda(*args, **kw)[0]
        harness.timed(RUN, row(impl="kda"), ours, harness.against(first))
        harness.stage_times(RUN, row(impl="kda stages"), ours)
        harness.timed(RUN, row(impl="fla"), lambda: fla_kda(*args, scale=D ** -0.5, **kw)[0], harness.against(first))
        if name == "layer call, softplus":
            harness.profile(ours, os.path.join(harness.OUT, f"{RUN}-layer.txt"), title=f"{name}\n")


def gva():
    import kda

    for HQ, HV in ((32, 32), (16, 32)):
        B, T = 1, 32768
        q, k, v, g, beta = harness.grouped_gdn_inputs(B, T, HQ, HV)
        row = lambda **more: {"stage": "gva", "B": B, "T": T, "HQ": HQ, "HV": HV, **more}
        ours = lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0]
        harness.timed(RUN, row(impl="op"), ours)
        harness.stage_times(RUN, row(impl="op stages"), ours)
        harness.profile(ours, os.path.join(harness.OUT, f"{RUN}-gva-{HQ}.txt"), title=f"{HQ}/{HV}\n")


if __name__ == "__main__":
    harness.time_stages()
    stages = sys.argv[1:] or ["gva", "layer"]
    if "gva" in stages:
        gva()
    if "layer" in stages:
        layer()
