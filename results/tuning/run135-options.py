"""Run 135 (prepared 2026-12-06): issue 41's table, each of a layer's options alone and all together, for kda and
fla in one process: the plain call (gate activated by the caller, unit keys, beta in [0, 1]); ``+ qk l2norm``
(raw keys and queries, ``use_qk_l2norm_in_kernel``); ``+ beta sigmoid`` (beta's logits,
``use_beta_sigmoid_in_kernel``); ``+ gate, softplus`` (the raw gate in bf16 with ``A_log`` and ``dt_bias``,
``use_gate_in_kernel``); ``+ gate, safe_gate`` (the same with ``safe_gate, lower_bound=-5``); and the layer's two
calls with all of them. Two sets of gates: ``A_log = 0`` (mild: ``-softplus(x + dt_bias)``, the spread of
``logsigmoid`` of noise) and ``A_log = log U(1, 16)`` as a layer initialises it (steep). The three level-5 shapes.

Then the layer (``--layer``): ``kda.layer.KimiDeltaAttention`` forward at a Kimi-Linear-like size (hidden 2304, 32
heads of 128, T 8192, bf16) against the same module with fla's pieces in place of ours and the same weights: fla's
``ShortConvolution`` (Triton), ``chunk_kda`` and ``FusedRMSNormGated`` (sigmoid). Rows to ``$OUT/run135.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run135-options.py --warm --options --layer
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run135"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128), (4, 4096, 64, 128)]
GATES = ("mild", "layer")
SAFE = dict(safe_gate=True, lower_bound=-5.0)


def calls(B, T, H, D, gates):
    """(call, arguments, keywords) at (B, T, H, D) with ``gates`` (``mild``: A_log = 0, ``layer``: log U(1, 16))."""
    from kda.reference import level4 as ref

    q, k, v, raw, logits, A_log, dt_bias = harness.layer_inputs(B, T, H, D)
    if gates == "mild":
        A_log = torch.zeros_like(A_log)
    x = raw + dt_bias.view(H, D)
    g = -A_log.exp()[:, None] * torch.nn.functional.softplus(x)             # what the kernel's softplus form makes
    qn, kn = (ref.l2_normalize(t.float()).bfloat16() for t in (q, k))
    beta, q3, k3, raw16 = torch.sigmoid(logits), q * 3, k * 3, raw.bfloat16()
    act = dict(A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True)
    every = dict(act, use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
    return [("plain", (qn, kn, v, g, beta), {}),
            ("+ qk l2norm", (q3, k3, v, g, beta), dict(use_qk_l2norm_in_kernel=True)),
            ("+ beta sigmoid", (qn, kn, v, g, logits), dict(use_beta_sigmoid_in_kernel=True)),
            ("+ gate, softplus", (qn, kn, v, raw16, beta), act),
            ("+ gate, safe_gate", (qn, kn, v, raw16, beta), dict(act, **SAFE)),
            ("layer call, softplus", (q3, k3, v, raw16, logits), every),
            ("layer call, safe_gate", (q3, k3, v, raw16, logits), dict(every, **SAFE))]


def warm_one(i):
    import kda

    _, args, kw = calls(1, 512, 96, 128, "layer")[i]
    kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return i


def warm():
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(7, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in futures.as_completed([pool.submit(warm_one, i) for i in range(7)]):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:
                print("warm failed:", repr(e)[:300], flush=True)


def options():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda

    for shape in SHAPES:
        for gates in GATES:
            for call, args, kw in calls(*shape, gates):
                first, row = [], {"shape": list(shape), "gates": gates, "call": call}
                harness.timed(RUN, {**row, "impl": "kda"}, lambda: kda.chunk_kda(*args, **kw)[0],
                              harness.against(first))
                harness.timed(RUN, {**row, "impl": "fla"},
                              lambda: fla_kda(*args, scale=shape[-1] ** -0.5, **kw)[0], harness.against(first))
                first.clear()
            torch.cuda.empty_cache()


def fla_forward(layer):
    """``layer`` (a ``kda.layer.KimiDeltaAttention``) run with fla's convolution, op and gated norm on its
    weights: the forward of a prefill."""
    from fla.modules import FusedRMSNormGated, ShortConvolution
    from fla.ops.kda import chunk_kda as fla_kda

    def conv(ours):
        theirs = ShortConvolution(ours.weight.shape[0], ours.width, activation="silu").to(ours.weight)
        theirs.weight.data.copy_(ours.weight.data)
        return theirs

    convs = [conv(c) for c in (layer.q_conv, layer.k_conv, layer.v_conv)]
    norm = FusedRMSNormGated(layer.V, activation="sigmoid", eps=1e-6).to(layer.o_norm)
    norm.weight.data.copy_(layer.o_norm.data)

    def forward(x):
        B, T, _ = x.shape
        q, k, v = (c(p(x))[0] for c, p in zip(convs, (layer.q_proj, layer.k_proj, layer.v_proj)))
        q, k = q.view(B, T, layer.H, layer.K), k.view(B, T, layer.H, layer.K)
        o, _ = fla_kda(q, k, v.view(B, T, layer.HV, layer.V), layer.f_proj(x).view(B, T, layer.HV, layer.K),
                       layer.b_proj(x), A_log=layer.A_log, dt_bias=layer.dt_bias, scale=layer.K ** -0.5,
                       use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        o = norm(o, layer.g_proj(x).view(B, T, layer.HV, layer.V))
        return layer.o_proj(o.reshape(B, T, -1))
    return forward


def layer_bench(T=8192, hidden=2304, heads=32, head_dim=128):
    from kda.layer import KimiDeltaAttention

    torch.manual_seed(0)
    layer = KimiDeltaAttention(hidden, heads, head_dim).cuda().bfloat16()
    layer.A_log.data, layer.dt_bias.data = layer.A_log.data.float(), layer.dt_bias.data.float()
    x = torch.randn(1, T, hidden, device="cuda").bfloat16()
    first, row = [], {"layer": "KimiDeltaAttention", "B": 1, "T": T, "hidden": hidden, "heads": heads,
                      "head_dim": head_dim}
    with torch.no_grad():
        harness.timed(RUN, {**row, "impl": "kda"}, lambda: layer(x)[0], harness.against(first))
        theirs = fla_forward(layer)
        harness.timed(RUN, {**row, "impl": "fla's pieces"}, lambda: theirs(x), harness.against(first))


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    if "--layer" in sys.argv:
        layer_bench()
    if "--options" in sys.argv:
        options()
