"""Run 41 (H200): where ``chunk_intra``'s time goes, line by line of the kernel's Python source.

Compiled with ``tl.emit_line_directives`` (tilelang writes ``#line`` directives that point at
``kda/kernels/level5.py`` and ``level4.py``; nvcc always adds ``-lineinfo``), one launch at
(1, 8192, 32, 128), bf16, logsigmoid gates, profiled by Nsight Compute with the source counters:
warp-state samples and executed instructions per source line. Run as

    python results/tuning/run41-ncu-intra-lines.py compile
    ncu --clock-control none -k regex:main_kernel --launch-count 1 --set full --import-source yes \
        -o $OUT/run41 python results/tuning/run41-ncu-intra-lines.py launch
    ncu -i $OUT/run41.ncu-rep --page source --csv --print-source sass > $OUT/run41-sass.csv
    python results/tuning/run41-ncu-intra-lines.py regions $OUT/run41-sass.csv

``regions`` splits the SASS at the block barriers and logs each region's share of the samples.
"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, intra_outputs, kda_inputs, log  # noqa: E402

RUN = "run41"
SHAPE = (1, 8192, 32, 128)
LINES = {"tl.emit_line_directives": True}


def kernel():
    from kda.kernels import level5
    from kda.kernels.build import compile_program
    return compile_program(level5.chunk_intra, (), pass_configs=LINES, DK=128, DV=128, chunk_size=64,
                           dtype="bfloat16", gate_dtype="float32")


def launch():
    import torch
    q, k, v, g, beta = kda_inputs(*SHAPE)
    outs = intra_outputs(q, v)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    kernel()(q, k, v, g, beta, SHAPE[-1] ** -0.5, *outs, flags)
    torch.cuda.synchronize()


def regions(path, run=RUN):
    """Split the SASS page (``--print-source sass``) at the block barriers; per region the share
    of the warp-state samples, the instructions executed per block and the commonest opcodes.
    (The CUDA page is empty: the line table names tilelang's temporary .cu file, not level5.py.)"""
    from collections import Counter
    with open(path) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    names = rows[head]
    ix = {n: i for i, n in enumerate(names)}
    body = [r for r in rows[head + 1:] if len(r) == len(names)]
    num = lambda r, n: float(r[ix[n]].replace(",", "") or 0) if r[ix[n]] not in ("", "-") else 0.0
    samples, executed = "Warp Stall Sampling (All Samples)", "Instructions Executed"
    total = sum(num(r, samples) for r in body) or 1.0
    blocks = (SHAPE[1] // 64) * SHAPE[2] * SHAPE[0]
    region, start = [], 0
    for n, r in enumerate(body):
        region.append(r)
        if "BAR.SYNC" in r[ix["Source"]] or n == len(body) - 1:
            ops = Counter()
            for x in region:
                words = x[ix["Source"]].split()
                ops[(words[1] if words[0].startswith("@") else words[0]).split(".")[0]] += num(x, executed)
            share = sum(num(x, samples) for x in region) / total
            if share >= 0.002:
                log(run, {"sass": [start, n], "share": round(share, 4),
                          "inst_per_block": round(sum(num(x, executed) for x in region) / blocks),
                          "top": {o: round(v / blocks) for o, v in ops.most_common(6)}})
            region, start = [], n + 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        kernel()
    if "launch" in sys.argv:
        launch()
    if "regions" in sys.argv:
        regions(sys.argv[-1], os.environ.get("RUN_NAME", RUN))
