"""Run 106 (prepared 2026-12-05): the walk by halvings, timed. Run 105's profile of KDA's forward + backward at
(1, 8192, 96, 128), bf16, has the pair kernel (chunk_pair_gradients) at 5.69 ms of the step's 13.2, most of it the
pairs inside 16-row sub-chunks summed one by one; and issue 41's layer call is slow because a layer's steep gates
send chunk_intra's diagonal blocks down the same kind of pair-by-pair sums. Both now have a walk by halvings
(``kda.kernels.halvings``): GEMMs through the upper half's last row of blocks of 64, 32, .. rows.

``steep``: chunk_kda's forward with mild (logsigmoid) and a layer's initial gates, the steep chunks by ``exp``
(the default), ``products``, ``halvings`` and (added with run 107) the diagonal about the sub-chunks' middles alone
and with halvings, also with safe_gate's gates, outputs against the default's; then the layer's call (raw gate with
``A_log`` and ``dt_bias``, beta's logits, the L2 norm in the op; with and without ``safe_gate, lower_bound=-5``) by
``exp`` and ``halvings``, beside fla's same call. ``backward``: KDA forward + backward with
``PAIR_SUMS_BY_HALVINGS`` off and on (down to blocks of 16, 4 and 1 rows), gradients against off's. Rows to
``$OUT/run106.jsonl``. The pair kernel alone: ``VARIANT_SET=run106 run101-pairs.py``.

    FLA_FLASH_QLA=0 python results/tuning/run106-halvings.py [steep] [backward]
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run106"
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
SHAPE = (1, 8192, 96, 128)


def steep():
    import kda
    from fla.ops.kda import chunk_kda as fla_kda
    from kda.kernels import chunk_intra             # the switches of the steep chunks

    leaves, _ = run91.inputs(*SHAPE, True)
    q, k, v, g, beta = (x.detach() for x in leaves)
    gen = torch.Generator(device="cuda").manual_seed(41)
    A = torch.empty(SHAPE[2], device="cuda").uniform_(1, 16, generator=gen)
    x = torch.randn(g.shape, generator=gen, device="cuda") + 0.1 * torch.randn(g.shape[2:], generator=gen,
                                                                               device="cuda")
    # (PAIRWISE_BY_PRODUCTS, PAIRWISE_BY_HALVINGS, DIAGONAL_ABOUT_MIDDLES); the middles added 2026-12-05 (run 107)
    variants = {"exp": (False, False, False), "products": (True, False, False), "halvings": (False, True, False),
                "middles": (False, False, True), "middles_halvings": (False, True, True)}
    switches = lambda name: (setattr(chunk_intra, "PAIRWISE_BY_PRODUCTS", variants[name][0]),
                             setattr(chunk_intra, "PAIRWISE_BY_HALVINGS", variants[name][1]),
                             setattr(chunk_intra, "DIAGONAL_ABOUT_MIDDLES", variants[name][2]))
    for gate_name, gate in (("logsigmoid", g), ("layer", -A[:, None] * torch.nn.functional.softplus(x)),
                            ("safe_gate", -5.0 * torch.sigmoid(A[:, None] * x))):
        first = []
        for name in variants:
            switches(name)
            harness.timed(RUN, {"stage": "steep", "gates": gate_name, "steep_chunks": name},
                  lambda: kda.chunk_kda(q, k, v, gate, beta)[0], harness.against(first))
    raw, logits = x, torch.randn(beta.shape, generator=gen, device="cuda")
    A_log, dt_bias = A.log(), 0.1 * torch.randn(SHAPE[2] * SHAPE[3], generator=gen, device="cuda")
    for safe in ({}, dict(safe_gate=True, lower_bound=-5.0)):
        call = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                    use_qk_l2norm_in_kernel=True, **safe)
        first = []
        for name in ("exp", "halvings", "middles", "middles_halvings"):
            switches(name)
            harness.timed(RUN, {"stage": "layer call", "safe_gate": bool(safe), "steep_chunks": name},
                  lambda: kda.chunk_kda(q * 3, k * 3, v, raw, logits, **call)[0], harness.against(first))
        harness.timed(RUN, {"stage": "layer call", "safe_gate": bool(safe), "op": "fla"},
              lambda: fla_kda(q * 3, k * 3, v, raw, logits, scale=SHAPE[3] ** -0.5, **call)[0], harness.against(first))
    switches("exp")
    torch.cuda.empty_cache()


def backward():
    import kda
    from kda import backward, cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    leaves, do = run91.inputs(*SHAPE, True)
    first = []
    for to in (None, 16, 4, 1):
        backward.PAIR_SUMS_BY_HALVINGS, backward.PAIR_HALVINGS_TO = to is not None, to or 4
        harness.timed(RUN, {"stage": "backward", "op": "KDA", "halve_to": to}, run91.step(kda.chunk_kda, leaves, do),
              harness.against(first), peak=True, warmup_ms=200, rep_ms=1000)
    backward.PAIR_SUMS_BY_HALVINGS = False
    torch.cuda.empty_cache()


if __name__ == "__main__":
    stages = sys.argv[1:] or ["steep", "backward"]
    if "steep" in stages:
        steep()
    if "backward" in stages:
        backward()
