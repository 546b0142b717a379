"""Run 121 (prepared 2026-12-06): two switches that landed off, timed. ``gva``: GDN with grouped value heads at
Qwen3-Next's shape (1, 32768, 16 query and key heads, 32 value heads, 128) and at (1, 131072, 2, 4), the op unsplit
against the op with ``SPLIT_GROUPED_VALUES`` (its split), and FlashQLA's automatic split. ``layer``: KDA as a layer
calls it (raw gate with ``A_log`` and ``dt_bias``, beta's logits, the L2 norm in the op; softplus and safe_gate's
sigmoid forms) at (1, 8192, 96, 128) with ``STEEP_FOR_ACTIVATED_GATES`` off and on, beside fla's same call. bf16,
every row against the first of its group. Rows to ``$OUT/run121.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run121-gva-layer.py [gva] [layer]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run121"


def gva():
    import flash_qla

    import kda
    from kda import distributed, gated_delta

    for B, T, HQ, HV in ((1, 32768, 16, 32), (1, 131072, 2, 4)):
        q, k, v, g, beta = harness.grouped_gdn_inputs(B, T, HQ, HV)
        first = []
        row = lambda **kw: {"stage": "gva", "B": B, "T": T, "HQ": HQ, "HV": HV, **kw}
        for name, split in (("op unsplit", False), ("op, SPLIT_GROUPED_VALUES", True)):
            distributed.SPLIT_GROUPED_VALUES = split
            harness.timed(RUN, row(impl=name), lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0],
                          harness.against(first))
        distributed.SPLIT_GROUPED_VALUES = False
        harness.timed(RUN, row(impl="FlashQLA auto_cp=True"),
                      lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5, auto_cp=True)[0],
                      harness.against(first))
        print("SPLIT_IN_OP", gated_delta.SPLIT_IN_OP)
        del q, k, v, g, beta
        torch.cuda.empty_cache()


def layer():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.kernels import chunk_intra

    B, T, H, D = 1, 8192, 96, 128
    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    for safe in ({}, dict(safe_gate=True, lower_bound=-5.0)):
        call = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                    use_qk_l2norm_in_kernel=True, **safe)
        first = []
        row = lambda **kw: {"stage": "layer call", "safe_gate": bool(safe), **kw}
        for on in (False, True):
            chunk_intra.STEEP_FOR_ACTIVATED_GATES = on
            harness.timed(RUN, row(impl=f"kda, STEEP_FOR_ACTIVATED_GATES={on}"),
                          lambda: kda.chunk_kda(q * 3, k * 3, v, raw, logits, **call)[0], harness.against(first))
        chunk_intra.STEEP_FOR_ACTIVATED_GATES = False
        harness.timed(RUN, row(impl="fla chunk_kda"),
                      lambda: fla_kda(q * 3, k * 3, v, raw, logits, scale=D ** -0.5, **call)[0],
                      harness.against(first))


if __name__ == "__main__":
    stages = sys.argv[1:] or ["gva", "layer"]
    if "gva" in stages:
        gva()
    if "layer" in stages:
        layer()
