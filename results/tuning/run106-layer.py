"""Run 106 (prepared 2026-12-05): issue 41's layer benchmark, first form. ``kda.layer.KimiDeltaAttention``'s prefill
at a Kimi-Linear-like size (hidden 2304, 32 heads of 128), bf16, with kda's ops (the defaults, and the steep chunks
by halvings), beside the same layer, same weights, with fla's ``chunk_kda`` in the place of kda's (fla-core 0.6.0,
the wheel the device has, ships the ops and not fla's layer classes: the projections, convolutions and norms are
the same module either way, so the difference is the op's). Median of ``do_bench``; the outputs against the
first's. Rows to ``$OUT/run106-layer.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run106-layer.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run106-layer"
SHAPES = ((1, 8192), (4, 4096), (1, 32768))


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import layer
    from kda.kernels import chunk_intra             # the switches of the steep chunks

    ours = layer.chunk_kda
    torch.manual_seed(0)
    model = layer.KimiDeltaAttention(hidden_size=2304, num_heads=32, head_dim=128).cuda().to(torch.bfloat16)
    for B, T in SHAPES:
        x = torch.randn(B, T, 2304, device="cuda").bfloat16()
        first = []
        for name, op, halvings in (("kda", ours, False), ("kda, steep chunks by halvings", ours, True),
                                   ("fla's chunk_kda", fla_kda, False)):
            layer.chunk_kda, chunk_intra.PAIRWISE_BY_HALVINGS = op, halvings
            with torch.no_grad():
                harness.timed(RUN, {"stage": "layer prefill", "B": B, "T": T, "ops": name}, lambda: model(x)[0],
                              harness.against(first))
        layer.chunk_kda, chunk_intra.PAIRWISE_BY_HALVINGS = ours, False
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
