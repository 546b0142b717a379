"""Run 124 (prepared 2026-12-06): the halvings with a C-row operand (``diagonal_by_halvings``: 108 KB of shared memory
for steep chunks, two blocks per SM, where the stacked 2C-row operand took 121 KB and one), timed. KDA at (1, 8192,
96, 128), bf16, a layer's gates; each row timed (``ms``) and kernel by kernel (``harness.stage_times``), fla's same
call beside it: the plain call (mild gates), a layer's gates activated by torch with ``PAIRWISE_BY_HALVINGS``, the
layer's call (softplus form; safe_gate's sigmoid form, whose middles take the stacked operand, and with
``MIDDLES_BY_ROWS``, added after run 124, two C-row GEMMs). Rows to
``$OUT/run124.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run124-layer.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run124"


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.kernels import chunk_intra
    from kda.reference import level4 as ref

    B, T, H, D = 1, 8192, 96, 128
    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    qn, kn = (ref.l2_normalize(x.float()).bfloat16() for x in (q, k))
    beta01 = torch.sigmoid(logits)
    layer_g = -A_log.exp()[:, None] * torch.nn.functional.softplus(raw + dt_bias.reshape(H, D))
    layer = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 use_qk_l2norm_in_kernel=True)
    rows = [
        ("plain (mild gates)", (qn, kn, v, torch.nn.functional.logsigmoid(raw), beta01), {}, False),
        ("activated before, halvings", (qn, kn, v, layer_g, beta01), {}, True),
        ("layer call, softplus", (q * 3, k * 3, v, raw, logits), layer, False),
        ("layer call, safe_gate", (q * 3, k * 3, v, raw, logits), dict(layer, safe_gate=True, lower_bound=-5.0),
         False),
        ("layer call, safe_gate, MIDDLES_BY_ROWS", (q * 3, k * 3, v, raw, logits),
         dict(layer, safe_gate=True, lower_bound=-5.0), False),
    ]
    for name, args, kw, halvings in rows:
        first = []
        chunk_intra.PAIRWISE_BY_HALVINGS = halvings
        chunk_intra.MIDDLES_BY_ROWS = "MIDDLES_BY_ROWS" in name
        try:
            ours = lambda: kda.chunk_kda(*args, **kw)[0]
            harness.timed(RUN, {"call": name, "impl": "kda"}, ours, harness.against(first))
            harness.stage_times(RUN, {"call": name, "impl": "kda stages"}, ours)
        finally:
            chunk_intra.PAIRWISE_BY_HALVINGS = False
            chunk_intra.MIDDLES_BY_ROWS = False
        harness.timed(RUN, {"call": name, "impl": "fla"}, lambda: fla_kda(*args, scale=D ** -0.5, **kw)[0],
                      harness.against(first))


if __name__ == "__main__":
    harness.time_stages()
    main()
