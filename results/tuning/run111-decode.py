"""Run 111 (prepared 2026-12-06): the decode step with its checks deferred (``kda.decode.DEFERRED_CHECKS``).

Issue 42 asks for a checked decode step that never waits for the GPU, at or below fla's time at batch 1, 64 and
512. The default step waits once, for its value checks' flags: 0.111 / 0.125 / 0.549 ms for KDA at batch 1 / 64
/ 512 in the decode record of 64ccb3f, against 0.035 / 0.073 / 0.531 unchecked and fla's 0.063 / 0.074 / 0.593.
Here each step is timed four ways in one process, dense (one state per sequence) and pooled (a state pool with
``ssm_state_indices``): checked and waiting, checked and deferred (the flags read at the next call), unchecked,
and fla. H = 32 heads of 128, one token per sequence, bf16, median of ``do_bench``.

    python results/tuning/run111-decode.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run111"


def main():
    import torch

    from kda import decode, fused_recurrent_gated_delta_rule, fused_recurrent_kda
    from kda.bench import median_ms, random_qkv
    from kda.reference import level4 as ref

    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdn
        from fla.ops.kda import fused_recurrent_kda as fla_kda
    except ImportError:
        fla_gdn = fla_kda = None
    H, D = 32, 128
    for op in ("KDA", "GDN"):
        for B in (1, 64, 512):
            q, k, v = random_qkv(B, 1, H, D, D, seed=B)
            k = ref.l2_normalize(k.float()).bfloat16()
            gen = torch.Generator(device="cuda").manual_seed(B + 1)
            g = torch.nn.functional.logsigmoid(torch.randn(B, 1, H, *([D] if op == "KDA" else []), generator=gen,
                                                           device="cuda"))
            beta = torch.rand(B, 1, H, generator=gen, device="cuda")
            h0 = torch.randn(B, H, D, D, generator=gen, device="cuda")
            pool = torch.randn(B + 8, H, D, D, generator=gen, device="cuda")
            slots = torch.randperm(B + 8, device="cuda")[:B]
            for form in ("dense", "pooled"):
                state = dict(initial_state=h0, output_final_state=True) if form == "dense" else \
                    dict(initial_state=pool, ssm_state_indices=slots)
                if op == "KDA":
                    ours = lambda check: fused_recurrent_kda(q, k, v, g, beta, check_values=check, **state)
                    peer = (lambda: fla_kda(q, k, v, g, beta, scale=D ** -0.5, **state)) if fla_kda else None
                else:
                    ours = lambda check: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, check_values=check,
                                                                          **state)
                    peer = (lambda: fla_gdn(q, k, v, g=g, beta=beta, scale=D ** -0.5, **state)) if fla_gdn else None
                row = {"what": "decode", "op": op, "B": B, "form": form}
                for name, fn, deferred in (("checked, waiting", lambda: ours(True), False),
                                           ("checked, deferred", lambda: ours(True), True),
                                           ("unchecked", lambda: ours(False), False), ("fla", peer, False)):
                    if fn is None:
                        continue
                    decode.DEFERRED_CHECKS = deferred
                    try:
                        row[name] = round(median_ms(fn), 4)
                        decode.raise_pending_checks()
                    except Exception as e:  # noqa: BLE001
                        row[name] = f"{type(e).__name__}: {str(e)[:160]}"
                    decode.DEFERRED_CHECKS = False
                log(RUN, row)


if __name__ == "__main__":
    main()
