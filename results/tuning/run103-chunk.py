"""Run 103 (prepared 2026-12-04, the session after run 102): GDN's chunk kernel of the backward
(``chunk_gradients``, a gate per head) alone and its variants. Run 100's profile put it at 2.55 ms of GDN's step
at (1, 8192, 96, 128): one block of 8 warps per SM (about 210 KB of shared memory, 255 registers), some twenty
GEMMs and as many CUDA-core phases per chunk one after the other, so latency more than bandwidth (its bytes take
about 0.5 ms at 4.3 TB/s). Variants: ``threads=512`` (16 warps: the CUDA-core phases spread over twice the
threads; registers capped at 128, 352 bytes spilled), ``pieces_in`` (``INVERSE_FROM_FORWARD``: ``T``, ``K K^T E``
and the scores read from the forward's ``chunk_intra`` instead of two GEMMs and the solve) and
``grad_dtype`` (``GRADS_IN_INPUT_DTYPE``), alone and together; each one's outputs against the default's.

    python results/tuning/run103-chunk.py compile time
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log  # noqa: E402

RUN = "run103-chunk"
SHAPE = (1, 8192, 96, 128)
VARIANTS = {"default": {}, "512_threads": dict(threads=512), "pieces_in": dict(pieces_in=True),
            "pieces_in_512_threads": dict(pieces_in=True, threads=512),
            "bf16_grads": dict(grad_dtype="bfloat16"),
            "pieces_in_bf16_grads": dict(pieces_in=True, grad_dtype="bfloat16"),
            "pieces_in_bf16_grads_512_threads": dict(pieces_in=True, grad_dtype="bfloat16", threads=512)}


def compile_one(i):
    """Compile the ``i``-th variant into the tilelang cache (and the forward's kernel with its backward outputs)."""
    import time

    from kda.kernels import backward_chunks, chunk_intra
    from kda.kernels.build import compile_program, ptxas_report

    jobs = [("chunk_gradients", dict(DK=128, DV=128, **params)) for params in VARIANTS.values()] + \
        [("chunk_intra", dict(DK=128, DV=128, scalar_gate=True, backward_outputs=True))]
    name, params = jobs[i]
    module = chunk_intra if name == "chunk_intra" else backward_chunks
    t = time.time()
    try:
        kernel = compile_program(getattr(module, name), (), **params)
        return {"compile": name, "params": params, "s": round(time.time() - t, 1), **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {"compile": name, "params": params, "s": round(time.time() - t, 1), "error": repr(e)[-400:]}


def time_kernels():
    import torch

    from kda.bench import median_ms
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.kernels import backward_chunks as kernels
    from kda.kernels import chunk_intra
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2

    B, T, H, D = SHAPE
    NC = T // 64
    gen = torch.Generator(device="cuda").manual_seed(103)
    rand = lambda *shape, dt=torch.bfloat16: torch.randn(*shape, generator=gen, device="cuda").to(dt)
    q, v, do = rand(B, T, H, D), rand(B, T, H, D), rand(B, T, H, D)
    k = torch.nn.functional.normalize(rand(B, T, H, D, dt=torch.float32), dim=-1).bfloat16()
    g = torch.nn.functional.logsigmoid(rand(B, T, H, dt=torch.float32))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    S, dS = rand(B, H, NC, D, D) * 0.1, rand(B, H, NC, D, D) * 0.1
    scale = D ** -0.5
    form, _, Tinv, KKE = prepare_chunks(q, k, v, g[..., None].contiguous(), beta, scale, backward_outputs=True)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    want = None
    for name, params in VARIANTS.items():
        try:
            kernel = compile_program(kernels.chunk_gradients, (), DK=D, DV=D, **params)
        except Exception as e:  # noqa: BLE001
            log(RUN, {"variant": name, "error": repr(e)[-300:]})
            continue
        grad = getattr(torch, params.get("grad_dtype", "float32"))
        outs = [torch.zeros(B, T, H, D, dtype=grad, device="cuda") for _ in range(3)] + \
            [torch.zeros(B, T, H, device="cuda") for _ in range(3)]
        read = [Tinv, KKE, form.A_qk] if params.get("pieces_in") else []
        run = lambda: kernel(q, k, v, do, g[..., None].contiguous(), beta, S, dS, *read, scale, *outs, flags)
        run()
        got = [x.float().clone() for x in outs]
        want = want or got
        row = {"kernel": "chunk_gradients", "variant": name, "finite": all(bool(torch.isfinite(x).all()) for x in got),
               "rel_l2_vs_default": {n: float(f"{rel_l2(a, b):.2e}")
                                     for n, a, b in zip("dq dk dv db dG to_end".split(), got, want)}}
        row["ms"] = round(median_ms(run, warmup_ms=100, rep_ms=500), 3)
        log(RUN, row)
    intra = compile_program(chunk_intra.chunk_intra, (), DK=D, DV=D, scalar_gate=True)
    outs = [torch.empty_like(x) for x in (form.Qw, form.Kw, form.decay, form.A_qk, form.W, form.U)]
    gate, no_chunks = g[..., None].contiguous(), torch.empty(1, 1, dtype=torch.int32, device="cuda")
    run = lambda: intra(q, k, v, gate, beta, scale, *outs, flags, no_chunks)
    log(RUN, {"kernel": "chunk_intra (scalar gate)", "ms": round(median_ms(run, warmup_ms=100, rep_ms=500), 3)})
    run = lambda: prepare_chunks(q, k, v, g[..., None].contiguous(), beta, scale, backward_outputs=True)
    log(RUN, {"kernel": "chunk_intra (scalar gate), backward outputs, with its allocations",
              "ms": round(median_ms(run, warmup_ms=100, rep_ms=500), 3)})


if __name__ == "__main__":
    stages = {"compile": lambda: compile_in_processes(RUN, len(VARIANTS) + 1, compile_one), "time": time_kernels}
    for stage in sys.argv[1:] or ["compile", "time"]:
        stages[stage]()
