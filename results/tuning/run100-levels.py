"""Run 100 (prepared 2026-12-04): levels 1-4 forward + backward against their fla peers. Issue 18's goal for
them is 1.5x fla's time; `LEVEL_BACKWARD` went on in run 98 and nothing has timed it. One step (forward,
then the gradients of q, k, v and the level's gate or beta from a random dO), bf16, median of ``do_bench``,
peak memory, and every gradient against fla's (relative L2), at the backward record's two shapes:

* level 1, ``linear_attention`` against ``chunk_linear_attn(normalize=False)``;
* level 2, ``decay_attention`` (alpha per head) against ``chunk_simple_gla(g_gamma=log alpha)``;
* level 3, ``gated_attention`` with a gate per head against ``chunk_simple_gla(g)``, and per channel against
  ``chunk_gla``;
* level 4, ``delta_rule`` against ``chunk_delta_rule``.

    FLA_FLASH_QLA=0 python results/tuning/run100-levels.py [BUDGET_S]
"""
import importlib.util
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)

RUN = "run100-levels"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]


def inputs(B, T, H, D, seed=11):
    from kda.reference import level4 as ref4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, v = rand(B, T, H, D).bfloat16(), rand(B, T, H, D).bfloat16()
    k = ref4.l2_normalize(rand(B, T, H, D)).bfloat16()
    alpha = 1 - torch.logspace(-1, -3, H)                        # decays per head, 0.9 to 0.999
    return dict(q=q, k=k, v=v, alpha=alpha, g_gamma=alpha.log().cuda(),
                g_head=torch.nn.functional.logsigmoid(rand(B, T, H)),
                g_channel=torch.nn.functional.logsigmoid(rand(B, T, H, D)),
                beta=torch.rand(B, T, H, generator=gen, device="cuda").bfloat16(), do=rand(B, T, H, D).bfloat16())


def levels(x, scale):
    """``{level: (own leaves, {implementation: fn(q, k, v, *own) -> o})}``."""
    import kda
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.linear_attn import chunk_linear_attn
    from fla.ops.simple_gla import chunk_simple_gla

    first = lambda out: out[0] if isinstance(out, tuple) else out
    return {
        "1 linear": ([], {"kda": lambda q, k, v: first(kda.linear_attention(q, k, v, scale=scale)),
                          "fla chunk_linear_attn": lambda q, k, v: chunk_linear_attn(
                              q, k, v, scale=scale, normalize=False)[0]}),
        "2 decay": ([], {"kda": lambda q, k, v: first(kda.decay_attention(q, k, v, x["alpha"], scale=scale)),
                         "fla chunk_simple_gla(g_gamma)": lambda q, k, v: chunk_simple_gla(
                             q, k, v, g_gamma=x["g_gamma"], scale=scale)[0]}),
        "3 gated, per head": (["g_head"], {
            "kda": lambda q, k, v, g: first(kda.gated_attention(q, k, v, g, scale=scale)),
            "fla chunk_simple_gla(g)": lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g, scale=scale)[0]}),
        "3 gated, per channel": (["g_channel"], {
            "kda": lambda q, k, v, g: first(kda.gated_attention(q, k, v, g, scale=scale)),
            "fla chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g=g, scale=scale)[0]}),
        "4 delta": (["beta"], {
            "kda": lambda q, k, v, b: first(kda.delta_rule(q, k, v, b, scale=scale)),
            "fla chunk_delta_rule": lambda q, k, v, b: chunk_delta_rule(q, k, v, b, scale=scale)[0]}),
    }


def main(budget_s):
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    start = time.monotonic()
    for B, T, H, D in SHAPES:
        x = inputs(B, T, H, D)
        for level, (own, impls) in levels(x, D ** -0.5).items():
            leaves = [t.detach().clone().requires_grad_() for t in [x["q"], x["k"], x["v"]] + [x[n] for n in own]]
            names = ["q", "k", "v"] + own
            want = None
            for name, fn in impls.items():
                if time.monotonic() - start > budget_s:
                    return
                run = lambda: torch.autograd.grad(fn(*leaves), leaves, x["do"])
                row = {"level": level, "B": B, "T": T, "H": H, "D": D, "impl": name}
                try:
                    got = run()
                    forward = lambda: fn(*(t.detach() for t in leaves))
                    row.update(ms=round(median_ms(run, warmup_ms=200, rep_ms=1000), 3),
                               forward_ms=round(median_ms(forward, warmup_ms=100, rep_ms=500), 3),
                               peak_MB=run91.peak_mb(run))
                except Exception as e:                  # a failure says why, the others go on
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    log(RUN, row)
                    continue
                want = want or got
                row["rel_l2_vs_first"] = {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                          for n, a, b in zip(names, got, want)}
                row["finite"] = all(bool(torch.isfinite(a).all()) for a in got)
                log(RUN, row)
            del leaves, want
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 400)
