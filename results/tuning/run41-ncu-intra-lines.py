"""Run 41 (H200): where ``chunk_intra``'s time goes, line by line of the kernel's Python source.

Compiled with ``tl.emit_line_directives`` (tilelang writes ``#line`` directives that point at
``kda/kernels/level5.py`` and ``level4.py``; nvcc always adds ``-lineinfo``), one launch at
(1, 8192, 32, 128), bf16, logsigmoid gates, profiled by Nsight Compute with the source counters:
warp-state samples and executed instructions per source line. Run as

    python results/tuning/run41-ncu-intra-lines.py compile
    ncu --clock-control none -k regex:main_kernel --launch-count 1 --set full --import-source yes \
        -o $OUT/run41 python results/tuning/run41-ncu-intra-lines.py launch
    ncu -i $OUT/run41.ncu-rep --page source --csv --print-source cuda > $OUT/run41-lines.csv
    python results/tuning/run41-ncu-intra-lines.py summary $OUT/run41-lines.csv

``summary`` folds the per-line table by source line and prints the lines with the most samples.
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


def summary(path):
    """Sum each numeric column of the source page over rows of the same file and line."""
    with open(path) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if any("Sampl" in c for c in r))
    names, body = rows[head], rows[head + 1:]
    print("columns:", names)
    keys = [i for i, n in enumerate(names) if n in ("File", "Source File", "Line", "# Line", "Source")]
    nums = [i for i, n in enumerate(names) if "Sampl" in n or "Instructions Executed" in n]
    total = {}
    for r in body:
        if len(r) != len(names):
            continue
        key = tuple(r[i] for i in keys)
        acc = total.setdefault(key, [0.0] * len(nums))
        for a, i in enumerate(nums):
            try:
                acc[a] += float(r[i].replace(",", ""))
            except ValueError:
                pass
    first = nums[0]
    grand = sum(v[0] for v in total.values()) or 1.0
    for key, v in sorted(total.items(), key=lambda kv: -kv[1][0])[:60]:
        row = {"line": " | ".join(key)[:160], "share": round(v[0] / grand, 4),
               **{names[i]: v[a] for a, i in enumerate(nums)}}
        log(RUN, row)
    print("sorted by", names[first])


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        kernel()
    if "launch" in sys.argv:
        launch()
    if "summary" in sys.argv:
        summary(sys.argv[-1])
