"""Run 65 (H200): branch l4-beta-flag (on check-prepared): level 4 checks beta inside chunk_wy and
reads its flag back between the kernels, the pass made ready before; level 5 makes its pass ready
before the read-back (run 64). Times at (1, 32768, 32, 128) bf16, same process, checked and not,
beside fla: ``delta_rule`` against ``chunk_delta_rule``, GDN and KDA against fla's Triton kernels.

    python results/tuning/run65-checks-between-kernels.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run65"


def main():
    import torch
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.bench import median_ms, random_qkv
    from kda.reference import level4 as ref4

    B, T, H, D = 1, 32768, 32, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=65)
    k = ref4.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(66)
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda")) / 16
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda")) / 16
    rows = {
        "delta_rule": lambda: kda.delta_rule(q, k, v, beta),
        "delta_rule, check_values=False": lambda: kda.delta_rule(q, k, v, beta, check_values=False),
        "fla chunk_delta_rule": lambda: chunk_delta_rule(q, k, v, beta, scale=D ** -0.5)[0],
        "GDN": lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0],
        "GDN, check_values=False": lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta, check_values=False)[0],
        "fla chunk_gated_delta_rule": lambda: fla_gdn(q, k, v, g, beta)[0],
        "KDA": lambda: kda.chunk_kda(q, k, v, gk, beta)[0],
        "KDA, check_values=False": lambda: kda.chunk_kda(q, k, v, gk, beta, check_values=False)[0],
        "fla chunk_kda": lambda: fla_kda(q, k, v, gk, beta)[0],
    }
    for name, fn in rows.items():
        try:
            log(RUN, {"shape": [B, T, H, D], "what": name, "ms": median_ms(fn)})
        except Exception as e:  # noqa: BLE001
            log(RUN, {"what": name, "error": repr(e)[-400:]})


if __name__ == "__main__":
    main()
