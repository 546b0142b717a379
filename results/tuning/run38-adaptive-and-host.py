"""Run 38 (H200, planned): the per-chunk choice of score sub-chunks, and the host part of chunk_kda.

* chunk_intra (bf16, B=1, T=32768, H=32, D=128) with the per-chunk choice (the default), with
  16-row sub-chunks only (wide_subchunk=None) and with 32-row ones only (subchunk=32,
  wide_subchunk=None), under logsigmoid(x) gates (every chunk can take 32 rows) and KDA-style
  -2 softplus(x) gates (90% of the chunks cannot): the choice should cost nothing where it is not
  taken and save the two GEMMs where it is; 32-only shows the pairwise path it avoids.
* the host part of chunk_kda: at (1, 64, 1, 128) the GPU work is a few microseconds, so the median
  is the host's time per call, with and without the flags read-back (check_values=False).

One JSON line per measurement to $OUT/run38.jsonl.

    python results/tuning/run38-adaptive-and-host.py compile time
"""
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

OUT = os.environ.get("OUT", "/tmp")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = dict(DK=128, DV=128, dtype="bfloat16")
VARIANTS = {"per chunk (default)": {}, "16 only": dict(wide_subchunk=None),
            "32 only": dict(subchunk=32, wide_subchunk=None)}


def compile_one(name):
    sys.path.insert(0, ROOT)
    from kda.kernels import level5
    from kda.kernels.build import compile_program
    t = time.time()
    try:
        compile_program(level5.chunk_intra, (), **BASE, **VARIANTS[name])
        return name, round(time.time() - t, 1), None
    except Exception as e:  # noqa: BLE001
        return name, round(time.time() - t, 1), repr(e)[-400:]


def log(row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "run38.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def compile_all():
    import multiprocessing as mp
    with ProcessPoolExecutor(max_workers=len(VARIANTS), mp_context=mp.get_context("spawn")) as ex:
        for name, secs, err in ex.map(compile_one, VARIANTS):
            log({"compile": name, "s": secs, "error": err})


def time_all():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms, random_qkv
    from kda.kernels import level5
    from kda.kernels.build import compile_program
    from kda.reference import level4 as ref4

    B, T, H, D, C = 1, 32768, 32, 128, 64
    q, k, v = random_qkv(B, T, H, D, D)
    k = ref4.l2_normalize(k.float()).bfloat16()
    x = torch.randn(B, T, H, D, device="cuda")
    gates = {"logsigmoid(x)": torch.nn.functional.logsigmoid(x), "-2 softplus(x)": -2 * torch.nn.functional.softplus(x)}
    beta = torch.rand(B, T, H, device="cuda")
    new = lambda shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt, device="cuda")
    outs = [new(q.shape), new(q.shape), new((B, H, T // C, D), torch.float32), new((B, T, H, C)), new(k.shape),
            new(v.shape)]
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    for name, params in VARIANTS.items():
        kern = compile_program(level5.chunk_intra, (), **BASE, **params)
        for gate, g in gates.items():
            log({"what": "chunk_intra", "variant": name, "gate": gate,
                 "ms": median_ms(lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags))})
    for gate, g in gates.items():
        for check in (True, False):
            log({"what": "chunk_kda", "gate": gate, "check_values": check,
                 "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=check))})
    del q, k, v, x, gates, beta, outs
    q, k, v = random_qkv(1, 64, 1, D, D)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 64, 1, D, device="cuda"))
    beta = torch.rand(1, 64, 1, device="cuda")
    for check in (True, False):
        log({"what": "chunk_kda, host-bound shape (1, 64, 1, 128)", "check_values": check,
             "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=check))})


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_all()
    if "time" in sys.argv:
        time_all()
