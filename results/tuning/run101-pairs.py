"""Run 101 (prepared 2026-12-04): KDA's three chunk kernels of the backward, each alone, and the variants of the
pair sums. A static count puts most of ``chunk_pair_gradients``' work in the pairs inside a sub-chunk, done one by
one with an exponential each, at 203 registers (one block of 8 warps per SM: little to hide the latency of its
scalar loops); ``shared_pairs`` halves that work (10,101 PTX instructions against 37,893) at 255 registers, and
``min_blocks=2`` caps the registers for two blocks per SM at the price of spills (324 bytes; 1,152 with
``shared_pairs``). Run 90 found a cap worth 2.1x on a kernel of the same kind. At (1, 8192, 96, 128), bf16, on
random inputs of the real shapes and ranges (a cumulative gate from logsigmoid per chunk): the time of
``chunk_pair_pieces``, ``chunk_state_gradients`` and each variant of ``chunk_pair_gradients``, and each variant's
outputs against the default's (relative L2; the kernel adds into ``dQ``, ``dK`` and ``dG``, so each check starts
from the same values).

    python results/tuning/run101-pairs.py compile time

``VARIANT_SET=run103`` (run 103): ``shared_pairs`` (the default since run 100) against the same split by
channels (``block_dk``: 16 or 32 channels per block, 128 threads, register caps) and with two blocks per SM, and
with ``products`` (the pairs inside a sub-chunk by running products of the token decays); rows to
``run103-pairs.jsonl``. ``VARIANT_SET=run106`` (run 106): that default against the pair sums by halvings
(``halve_to``: 16, 8, 4, 2, 1); rows to ``run106-pairs.jsonl``.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log  # noqa: E402

RUN = "run101"
SHAPE = (1, 8192, 96, 128)
VARIANTS = {"default": {}, "shared_pairs": dict(shared_pairs=True), "min_blocks_2": dict(min_blocks=2),
            "shared_pairs_min_blocks_2": dict(shared_pairs=True, min_blocks=2)}
OTHERS = {"chunk_pair_pieces": dict(DK=128), "chunk_state_gradients": dict(DK=128, DV=128)}
if os.environ.get("VARIANT_SET") == "run106":
    # run 106: the default since run 103 (32 channels, 4 blocks per SM) against the pair sums by halvings down
    # to blocks of 16, 8, 4, 2 and 1 rows (halve_to)
    RUN = "run106-pairs"
    default = dict(shared_pairs=True, block_dk=32, threads=128, min_blocks=4)
    VARIANTS = {"by_32_channels_4_blocks": default,
                **{f"halve_to_{n}": dict(default, halve_to=n) for n in (16, 8, 4, 2, 1)}}
elif os.environ.get("VARIANT_SET") == "run103":
    RUN = "run103-pairs"
    shared = dict(shared_pairs=True)
    VARIANTS = {"shared_pairs": shared, "shared_pairs_min_blocks_2": dict(shared, min_blocks=2),
                "by_16_channels": dict(shared, block_dk=16, threads=128),
                "by_32_channels_3_blocks": dict(shared, block_dk=32, threads=128, min_blocks=3),
                "by_32_channels_4_blocks": dict(shared, block_dk=32, threads=128, min_blocks=4),
                "by_32_channels_256_threads": dict(shared, block_dk=32, threads=256),
                "by_64_channels_2_blocks": dict(shared, block_dk=64, threads=256, min_blocks=2),
                "shared_pairs_products": dict(shared, products=True),
                "by_16_channels_products": dict(shared, block_dk=16, threads=128, products=True),
                "by_32_channels_products": dict(shared, block_dk=32, threads=256, products=True)}


def compile_one(i):
    """Compile the ``i``-th kernel (the two other kernels, then each variant) into the tilelang cache."""
    import time

    from kda.kernels import backward_chunks
    from kda.kernels.build import compile_program, ptxas_report

    jobs = [(name, params) for name, params in OTHERS.items()] + \
        [("chunk_pair_gradients", dict(DK=128, **params)) for params in VARIANTS.values()]
    name, params = jobs[i]
    t = time.time()
    try:
        kernel = compile_program(getattr(backward_chunks, name), (), **params)
        return {"compile": name, "params": params, "s": round(time.time() - t, 1), **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {"compile": name, "params": params, "s": round(time.time() - t, 1), "error": repr(e)[-400:]}


def time_kernels():
    import torch

    from kda.bench import median_ms
    from kda.kernels import backward_chunks as kernels
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2

    B, T, H, D = SHAPE
    C, NC = 64, T // 64
    gen = torch.Generator(device="cuda").manual_seed(101)
    rand = lambda *shape, dt=torch.bfloat16: torch.randn(*shape, generator=gen, device="cuda").to(dt)
    q, v, do = rand(B, T, H, D), rand(B, T, H, D), rand(B, T, H, D)
    k = torch.nn.functional.normalize(rand(B, T, H, D, dt=torch.float32), dim=-1).bfloat16()
    g = torch.nn.functional.logsigmoid(rand(B, T, H, D, dt=torch.float32))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    S, dS = rand(B, H, NC, D, D) * 0.1, rand(B, H, NC, D, D) * 0.1
    new = lambda *shape, dt=torch.float32: torch.zeros(*shape, dtype=dt, device="cuda")
    scale = D ** -0.5
    pieces = compile_program(kernels.chunk_pair_pieces, (), DK=D)
    states = compile_program(kernels.chunk_state_gradients, (), DK=D, DV=D)
    G, KKE = new(B, H, T, D), new(B, T, H, C)
    Tinv, P = new(B, T, H, C, dt=torch.bfloat16), new(B, T, H, C, dt=torch.bfloat16)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    run_pieces = lambda: pieces(q, k, g, beta, scale, G, Tinv, P, KKE, flags)
    run_pieces()
    dq, dk, dG, to_end, dv, db = new(B, T, H, D), new(B, T, H, D), new(B, T, H, D), new(B, T, H, D), \
        new(B, T, H, D), new(B, T, H)
    dPs, dAb = new(B, T, H, C, dt=torch.bfloat16), new(B, T, H, C, dt=torch.bfloat16)
    run_states = lambda: states(q, k, v, do, G, beta, S, dS, Tinv, P, KKE, scale, dq, dk, dv, db, dG, to_end, dPs,
                                dAb)
    run_states()
    for name, run in (("chunk_pair_pieces", run_pieces), ("chunk_state_gradients", run_states)):
        log(RUN, {"kernel": name, "ms": round(median_ms(run, warmup_ms=100, rep_ms=500), 3)})
    start = [x.clone() for x in (dq, dk, dG)]
    want = None
    for name, params in VARIANTS.items():
        try:
            pairs = compile_program(kernels.chunk_pair_gradients, (), DK=D, **params)
        except Exception as e:  # noqa: BLE001
            log(RUN, {"variant": name, "error": repr(e)[-300:]})
            continue
        outs = [x.clone() for x in start]
        pairs(q, k, G, dPs, dAb, scale, *outs)
        want = want or outs
        row = {"kernel": "chunk_pair_gradients", "variant": name,
               "rel_l2_vs_default": {n: float(f"{rel_l2(a, b):.2e}") for n, a, b in zip(("dq", "dk", "dG"), outs, want)},
               "finite": all(bool(torch.isfinite(a).all()) for a in outs)}
        timed = [x.clone() for x in start]
        row["ms"] = round(median_ms(lambda: pairs(q, k, G, dPs, dAb, scale, *timed), warmup_ms=100, rep_ms=500), 3)
        log(RUN, row)


if __name__ == "__main__":
    jobs = len(OTHERS) + len(VARIANTS)
    stages = {"compile": lambda: compile_in_processes(RUN, jobs, compile_one), "time": time_kernels}
    for stage in sys.argv[1:] or ["compile", "time"]:
        stages[stage]()
