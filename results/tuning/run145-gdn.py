"""Run 145 (prepared 2026-12-06): GDN's and KDA's passes with the output's GEMMs after the chain's (``chain_first``).

Run 139's profile had the pass at 509 us against FlashQLA's fused kernel's 407 with fewer instructions (89.0M against
96.9M): its warps wait more. Run 143 ruled out the 64 barriers a chunk. Per chunk, warpgroup 1's ``K S``, its ``Tb X``
and the chain's ``K^T V'`` are on the chain, and the output warpgroup's ``Q S`` (issued when ``S`` is published, at
the same moment as ``K S``) and ``P V_new`` (beside ``K^T V'``) share the SM's tensor cores with them.
``scalar_gate.CHAIN_FIRST`` 1 holds ``Q S`` until ``K S`` is done, 2 also ``P V_new`` until ``K^T V'`` is; the same
products, so the same bits. This times the op with 0, 1 and 2, kernel by kernel, dense at the two shapes of issue 15
and packed (96 random lengths; 1024 sequences of 1 to 64 tokens), beside FlashQLA and fla's Triton GDN, with the cases
and inputs of ``run140-gdn.py``; then KDA's state pass the same way (``gated_state_pass.CHAIN_FIRST``: ``Qw S`` after
``W S``, ``A_qk V_new`` after ``Kw^T V_new``) at (1, 8192, 96, 128) and on 96 packed random lengths, beside fla's
``chunk_kda``. Rows to ``$OUT/run145.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run145-gdn.py --warm
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes  # noqa: E402

spec = importlib.util.spec_from_file_location("run140_gdn", os.path.join(HERE, "run140-gdn.py"))
run140 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run140)

RUN = "run145"
VARIANTS = {"chain_first 0 (default)": 0, "chain_first 1": 1, "chain_first 2": 2}


def use(name):
    from kda.kernels import gated_state_pass, scalar_gate

    scalar_gate.CHAIN_FIRST = gated_state_pass.CHAIN_FIRST = VARIANTS[name]


def warm_one(i):
    """Each variant's kernels compiled by one call of the op per case (a process of its own)."""
    from kda import gated_delta

    name = list(VARIANTS)[i]
    use(name)
    for _, (q, k, v, g, beta), cu in run140.cases():
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    torch.cuda.synchronize()
    return {"what": "warm", "variant": name}


def kda_cases():
    q, k, v, _, beta = run140.dense_inputs(1, 8192, 96, 128)
    yield "KDA dense 1x8192x96x128", (q, k, v, beta), None
    lens = run140.lengths("96 random lengths")
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
    q, k, v, _, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
    yield "KDA 96 random lengths", (q, k, v, beta), cu


def kda_compare():
    """KDA's op with each variant, kernel by kernel, the outputs against the default's bit for bit, beside fla."""
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import gated_delta
    from kda.bench import median_ms
    from harness import log, stage_times

    for name, (q, k, v, beta), cu in kda_cases():
        g = torch.nn.functional.logsigmoid(torch.randn(*k.shape, device="cuda"))
        outs = {}
        for variant in VARIANTS:
            use(variant)
            fn = lambda: gated_delta.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
            outs[variant] = fn()
            log(RUN, {"case": name, "impl": f"kda {variant}", "ms": round(median_ms(fn), 4)})
            stage_times(RUN, {"case": name, "impl": f"kda {variant}", "what": "stages"}, fn)
        use(list(VARIANTS)[0])
        first = outs[list(VARIANTS)[0]]
        log(RUN, {"case": name, "same_bits": {n: [torch.equal(x, y) for x, y in zip(o, first)] for n, o in outs.items()}})
        log(RUN, {"case": name, "impl": "fla chunk_kda",
                  "ms": round(median_ms(lambda: fla_kda(q, k, v, g, beta, scale=128 ** -0.5, cu_seqlens=cu)[0]), 4)})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS), warm_one)
    run140.compare(RUN, list(VARIANTS), use)
    kda_compare()
