"""Run 135 (prepared 2026-12-06): GDN's inverse compact. ``chunk_gated_inverse(compact=True)`` keeps the merge's
scratch and ``Tb``'s tile in ``A_s``'s spent bytes (72.7 KB of shared memory to 49.5 KB), so that four blocks fit an SM
where three did (``min_blocks=4``: 64 registers, no spill). The same sums in the same order: ``G`` and ``Tb`` must
equal the default's bit for bit. Timed alone against the default and FlashQLA's ``kkt_solve`` (ungated, no cumsum),
then the op (``chunk_gated_delta_rule``, the split routed as by default) with each, beside FlashQLA's forward.
Rows to ``$OUT/run135.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run135-inverse.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run135"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128)]
VARIANTS = {"default": {}, "compact": dict(compact=True, min_blocks=4)}


def inputs(B, T, H, D, seed=7):
    from kda.reference import level4 as ref4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, k, v = draw(B, T, H, D).bfloat16(), ref4.l2_normalize(draw(B, T, H, D)).bfloat16(), draw(B, T, H, D).bfloat16()
    return q, k, v, torch.nn.functional.logsigmoid(draw(B, T, H)), torch.rand(B, T, H, generator=gen, device="cuda")


def warm_one(name):
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    compile_program(scalar_gate.chunk_gated_inverse, (), DK=128, dtype="bfloat16",
                    **{**scalar_gate.SCALAR_GATE_INVERSE_CONFIG, **VARIANTS[name]})
    return name


def warm():
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in futures.as_completed([pool.submit(warm_one, n) for n in VARIANTS]):
            try:
                print("warm:", done.result(), flush=True)
            except Exception as e:
                print("warm failed:", repr(e)[:300], flush=True)


def main():
    import flash_qla
    from flash_qla.ops.gated_delta_rule.chunk.hopper.kkt_solve import kkt_solve

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2

    default = dict(scalar_gate.SCALAR_GATE_INVERSE_CONFIG)
    scalar_gate.COMPACT_DTYPES = ()        # since run 135 the op adds COMPACT_INVERSE for bf16: each variant as given
    for B, T, H, D in SHAPES:
        q, k, v, g, beta = inputs(B, T, H, D)
        shape = {"B": B, "T": T, "H": H, "D": D}
        C, NC = 64, -(-T // 64)
        no_table = torch.empty(1, 1, dtype=torch.int32, device="cuda")
        first = None
        for name, extra in VARIANTS.items():
            kernel = compile_program(scalar_gate.chunk_gated_inverse, (), DK=D, dtype="bfloat16", **default, **extra)
            G = torch.full((B, H, NC * C), float("nan"), device="cuda")
            Tb = torch.full((B, T, H, C), float("nan"), dtype=torch.bfloat16, device="cuda")
            flags = torch.zeros(2, dtype=torch.int32, device="cuda")
            run = lambda: kernel(k, g, beta, G, Tb, flags, no_table)
            run()
            first = first or (G.clone(), Tb.clone())
            log(RUN, {"what": "inverse", **shape, "variant": name, "flags": flags.tolist(),
                      "same_bits": torch.equal(G, first[0]) and torch.equal(Tb, first[1]),
                      "Tb_rel": float(f"{rel_l2(Tb, first[1]):.2e}"), "ms": round(median_ms(run), 4)})
        log(RUN, {"what": "inverse", **shape, "variant": "FlashQLA kkt_solve",
                  "ms": round(median_ms(lambda: kkt_solve(k, beta.bfloat16())), 4)})
        ref = None
        for name, extra in VARIANTS.items():
            scalar_gate.SCALAR_GATE_INVERSE_CONFIG = {**default, **extra}
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta)[0]
            o = fn()
            ref = o if ref is None else ref
            log(RUN, {"what": "op", **shape, "inverse": name, "ms": round(median_ms(fn), 4),
                      "rel_vs_default": float(f"{rel_l2(o, ref):.2e}")})
        scalar_gate.SCALAR_GATE_INVERSE_CONFIG = default
        fn = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5)[0]
        log(RUN, {"what": "op", **shape, "inverse": "FlashQLA 0.1.3", "ms": round(median_ms(fn), 4),
                  "rel_vs_default": float(f"{rel_l2(fn(), ref):.2e}")})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        warm()
    main()
