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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile  # noqa: E402

RUN = "run38"
BASE = dict(DK=128, DV=128, dtype="bfloat16")
VARIANTS = {"per chunk (default)": {}, "16 only": dict(wide_subchunk=None),
            "32 only": dict(subchunk=32, wide_subchunk=None)}


def compile_one(i):
    sys.path.insert(0, ROOT)
    from kda.kernels import level5
    name = list(VARIANTS)[i]
    return {"compile": name, **try_compile(lambda: level5.chunk_intra, dict(BASE, **VARIANTS[name]))}


def time_all():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms, random_qkv
    from kda.kernels import level5
    from kda.kernels.build import compile_program

    B, T, H, D = 1, 32768, 32, 128
    q, k, v, g, beta = kda_inputs(B, T, H, D)
    x = torch.randn(B, T, H, D, device="cuda")
    gates = {"logsigmoid(x)": torch.nn.functional.logsigmoid(x), "-2 softplus(x)": -2 * torch.nn.functional.softplus(x)}
    outs = intra_outputs(q, v)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    for name, params in VARIANTS.items():
        kern = compile_program(level5.chunk_intra, (), **BASE, **params)
        for gate, g in gates.items():
            log(RUN, {"what": "chunk_intra", "variant": name, "gate": gate,
                 "ms": median_ms(lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags))})
    for gate, g in gates.items():
        for check in (True, False):
            log(RUN, {"what": "chunk_kda", "gate": gate, "check_values": check,
                 "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=check))})
    del q, k, v, g, x, gates, beta, outs
    q, k, v = random_qkv(1, 64, 1, D, D)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 64, 1, D, device="cuda"))
    beta = torch.rand(1, 64, 1, device="cuda")
    for check in (True, False):
        log(RUN, {"what": "chunk_kda, host-bound shape (1, 64, 1, 128)", "check_values": check,
             "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=check))})


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS), compile_one)
    if "time" in sys.argv:
        time_all()
