"""Run 123 (prepared 2026-12-06): why a layer's call takes chunk_intra 6.35 ms (run 122, H100) where the same kernel
by halvings on a layer's gates activated beforehand took about 2.6 (run 119). KDA at (1, 8192, 96, 128), bf16, gates
as a layer draws them; each row timed (``ms``) and kernel by kernel (``harness.stage_times``):

* ``activated before, halvings``: ``PAIRWISE_BY_HALVINGS`` on, the gate, beta and the keys' norm made by torch;
* ``gate in kernel``: the raw gate with ``A_log`` and ``dt_bias`` alone (beta in [0, 1], unit keys);
* ``gate + beta in kernel``: and beta's logits;
* ``layer call``: and the keys' norm in the op (the layer's call, as run 122 timed it);
* ``layer call, norm by torch``: ``L2NORM_IN_KERNEL`` off (the norm by the norm kernel before chunk_intra).

Then the grouped split, now with the kernels reading the grouped heads: GDN at (1, 32768, 16 / 32) and (1, 131072,
2 / 4), timed and kernel by kernel, beside FlashQLA's ``auto_cp``. Rows to ``$OUT/run123.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run123-steep.py [steep] [gva]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run123"


def steep():
    import kda
    from kda import gated_delta
    from kda.kernels import chunk_intra
    from kda.reference import level4 as ref

    B, T, H, D = 1, 8192, 96, 128
    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    beta01 = torch.sigmoid(logits)
    layer_g = -A_log.exp()[:, None] * torch.nn.functional.softplus(raw + dt_bias.reshape(H, D))
    gate = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True)
    rows = [
        ("activated before, halvings", (qn, kn, v, layer_g, beta01), {}, dict(PAIRWISE_BY_HALVINGS=True)),
        ("gate in kernel", (qn, kn, v, raw, beta01), gate, {}),
        ("gate + beta in kernel", (qn, kn, v, raw, logits), dict(gate, use_beta_sigmoid_in_kernel=True), {}),
        ("layer call", (q * 3, k * 3, v, raw, logits),
         dict(gate, use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True), {}),
        ("layer call, norm by torch", (q * 3, k * 3, v, raw, logits),
         dict(gate, use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True), dict(L2NORM_IN_KERNEL=False)),
    ]
    first = []
    for name, args, kw, switches in rows:
        saved = {s: getattr(chunk_intra if hasattr(chunk_intra, s) else gated_delta, s) for s in switches}
        for s, on in switches.items():
            setattr(chunk_intra if hasattr(chunk_intra, s) else gated_delta, s, on)
        try:
            ours = lambda: kda.chunk_kda(*args, **kw)[0]
            harness.timed(RUN, {"stage": "steep", "call": name, "impl": "kda"}, ours, harness.against(first))
            harness.stage_times(RUN, {"stage": "steep", "call": name, "impl": "kda stages"}, ours)
        finally:
            for s, on in saved.items():
                setattr(chunk_intra if hasattr(chunk_intra, s) else gated_delta, s, on)


def gva():
    import flash_qla

    import kda

    for B, T, HQ, HV in ((1, 32768, 16, 32), (1, 131072, 2, 4)):
        q, k, v, g, beta = harness.grouped_gdn_inputs(B, T, HQ, HV)
        row = lambda **more: {"stage": "gva", "B": B, "T": T, "HQ": HQ, "HV": HV, **more}
        first = []
        ours = lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0]
        harness.timed(RUN, row(impl="op (split, grouped kernels)"), ours, harness.against(first))
        harness.stage_times(RUN, row(impl="op stages"), ours)
        harness.timed(RUN, row(impl="FlashQLA auto_cp=True"),
                      lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5, auto_cp=True)[0],
                      harness.against(first))
        del q, k, v, g, beta
        torch.cuda.empty_cache()


if __name__ == "__main__":
    harness.time_stages()
    stages = sys.argv[1:] or ["gva", "steep"]
    if "gva" in stages:
        gva()
    if "steep" in stages:
        steep()
