"""Run 50 (H200, planned): the delta rule through level 5's scalar-gate path, and GDN's stages.

Issue 16 asks for level 4 at 1.5x fla's ``chunk_delta_rule`` (1.21x in the record: 1.74 against
2.11 ms at (1, 32768, 32, 128)) and for one WY tail and one state pass with a gate option. The delta
rule is the gated delta rule with ``g = 0``; level 5's ``chunk_intra(scalar_gate=True)`` takes its
scores in one GEMM of raw ``[q; k] k^T`` and applies the (here unit) decay when it writes them, so
``chunk_gated_delta_rule(q, k, v, zeros, beta)`` is the whole level-4 forward on level 5's
kernels. This run times it beside ``kda.delta_rule`` and fla, both checked and unchecked, with the
stages of each; checks both against the float64 recurrence at (2, 1000, 4, 128) (tails included);
and times GDN's stages (``chunk_intra`` scalar path against the per-channel path on the broadcast
gate, the state pass) at the two shapes of issue 15.

    python results/tuning/run50-delta-rule-through-level5.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, log  # noqa: E402

RUN = "run50"


def main():
    import torch

    from kda import chunk_gated_delta_rule, delta_rule
    from kda.bench import median_ms, random_qkv
    from kda.gated_delta import prepare_chunks, run_state_pass
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref
    from fla.ops.delta_rule import chunk_delta_rule

    # errors against the float64 recurrence, a ragged length
    B, T, H, D = 2, 1000, 4, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=11)
    k = ref.l2_normalize(k.float()).bfloat16()
    beta = torch.rand(B, T, H, device="cuda").bfloat16()
    want = ref.recurrent(q.double() * D ** -0.5, k.double(), v.double(), beta.double())[0]
    zeros = torch.zeros(B, T, H, device="cuda")
    for name, out in [("kda.delta_rule", delta_rule(q, k, v, beta)),
                      ("chunk_gated_delta_rule, g = 0", chunk_gated_delta_rule(q, k, v, zeros, beta)[0]),
                      ("fla chunk_delta_rule", chunk_delta_rule(q, k, v, beta, scale=D ** -0.5)[0])]:
        log(RUN, {"check": name, "shape": [B, T, H, D], "nan": bool(out.isnan().any()),
                  "rel_l2_vs_float64": rel_l2(out, want)})

    # the level-4 headline
    B, T, H, D = 1, 32768, 32, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=5)
    k = ref.l2_normalize(k.float()).bfloat16()
    beta = torch.rand(B, T, H, device="cuda").bfloat16()
    zeros = torch.zeros(B, T, H, device="cuda")
    calls = {
        "kda.delta_rule": lambda: delta_rule(q, k, v, beta),
        "kda.delta_rule, unchecked": lambda: delta_rule(q, k, v, beta, check_values=False),
        "chunk_gated_delta_rule, g = 0": lambda: chunk_gated_delta_rule(q, k, v, zeros, beta),
        "chunk_gated_delta_rule, g = 0, unchecked": lambda: chunk_gated_delta_rule(q, k, v, zeros, beta,
                                                                                 check_values=False),
        "fla chunk_delta_rule": lambda: chunk_delta_rule(q, k, v, beta, scale=D ** -0.5),
    }
    for name, fn in calls.items():
        log(RUN, {"what": name, "shape": [B, T, H, D], "ms": median_ms(fn)})
    form = prepare_chunks(q, k, v, zeros[..., None], beta, D ** -0.5)
    log(RUN, {"what": "chunk_intra, scalar path, g = 0", "shape": [B, T, H, D],
              "ms": median_ms(lambda: prepare_chunks(q, k, v, zeros[..., None], beta, D ** -0.5))})
    log(RUN, {"what": "state pass", "shape": [B, T, H, D], "ms": median_ms(lambda: run_state_pass(form, None))})

    # GDN's stages at issue 15's shapes: the scalar path against the per-channel path on the broadcast gate
    for B, T, H in [(1, 32768, 32), (1, 8192, 96)]:
        q, k, v = random_qkv(B, T, H, D, D, seed=7)
        k = ref.l2_normalize(k.float()).bfloat16()
        beta = torch.rand(B, T, H, device="cuda").bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
        wide = g[..., None].expand(B, T, H, D).contiguous()
        scalar = prepare_chunks(q, k, v, g[..., None], beta, D ** -0.5)
        channel = prepare_chunks(q, k, v, wide, beta, D ** -0.5)
        o_s, o_c = run_state_pass(scalar, None)[0], run_state_pass(channel, None)[0]
        log(RUN, {"check": "GDN scalar path against per-channel path", "shape": [B, T, H, D],
                  "rel_l2": rel_l2(o_s, o_c.double())})
        for name, fn in [("chunk_intra, scalar path", lambda: prepare_chunks(q, k, v, g[..., None], beta, D ** -0.5)),
                         ("chunk_intra, per-channel path", lambda: prepare_chunks(q, k, v, wide, beta, D ** -0.5)),
                         ("state pass", lambda: run_state_pass(scalar, None)),
                         ("chunk_gated_delta_rule", lambda: chunk_gated_delta_rule(q, k, v, g, beta)),
                         ("chunk_gated_delta_rule, unchecked",
                          lambda: chunk_gated_delta_rule(q, k, v, g, beta, check_values=False))]:
            log(RUN, {"what": f"GDN {name}", "shape": [B, T, H, D], "ms": median_ms(fn)})


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
