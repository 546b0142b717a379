"""Run 136 (prepared 2026-12-06): the KDA layer with its own kernels (``kda.layer.LAYER_KERNELS``: the short
convolutions by ``kda.kernels.causal_conv`` and the gated output norm by ``kda.kernels.norms``) against the same layer
by torch and against the same module with fla's pieces (run 135's ``fla_forward``), at run 135's Kimi-Linear-like size
(hidden 2304, 32 heads of 128, bf16, no grad) and T 8192 and 32768; then a decode step (B 64, one token, from a
prefill's cache) each way. Rows to ``$OUT/run136.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run136-layer.py
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run136"


def run135():
    spec = importlib.util.spec_from_file_location("run135_options", os.path.join(HERE, "run135-options.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    from kda import layer as layer_module
    from kda.layer import KimiDeltaAttention

    fla_forward = run135().fla_forward
    torch.manual_seed(0)
    hidden, heads, head_dim = 2304, 32, 128
    layer = KimiDeltaAttention(hidden, heads, head_dim).cuda().bfloat16()
    layer.A_log.data, layer.dt_bias.data = layer.A_log.data.float(), layer.dt_bias.data.float()
    theirs = fla_forward(layer)
    with torch.no_grad():
        for T in (8192, 32768):
            x = torch.randn(1, T, hidden, device="cuda").bfloat16()
            first, row = [], {"what": "prefill", "B": 1, "T": T, "hidden": hidden, "heads": heads}
            for on in (False, True):
                layer_module.LAYER_KERNELS = on
                harness.timed(RUN, {**row, "impl": "kda, layer kernels" if on else "kda, torch's parts"},
                              lambda: layer(x)[0], harness.against(first))
            harness.timed(RUN, {**row, "impl": "fla's pieces"}, lambda: theirs(x), harness.against(first))
            del x
            torch.cuda.empty_cache()
        x = torch.randn(64, 16, hidden, device="cuda").bfloat16()
        step = torch.randn(64, 1, hidden, device="cuda").bfloat16()
        first = []
        for on in (False, True):
            layer_module.LAYER_KERNELS = on
            _, cache = layer(x)
            harness.timed(RUN, {"what": "decode step", "B": 64, "impl": "kda, layer kernels" if on else
                                "kda, torch's parts"}, lambda: layer(step, cache, decode=True)[0],
                          harness.against(first))


if __name__ == "__main__":
    main()
