"""Run 92 (H200, prepared 2026-12-03, not yet run): where else GDN's scalar-gate path pays, now that its
first kernel takes 0.35 ms (run 90). Every row is the op ``chunk_gated_delta_rule`` timed by
``do_bench`` (median), each path forced by the switches of ``kda.gated_delta`` and ``kda.distributed``,
its output against level 5's path (rel L2):

* packed sequences (``SCALAR_GATE_PACKED``): the two cases of ``snippets/level5/packed_latency.py``
  (96 random lengths over 32768 tokens; 1024 sequences of 1 to 64 tokens), H = 32, and Qwen3-Next's
  grouped value heads (16 / 32) unpacked, each by level 5's path and by the scalar-gate path;
* 32 heads, (1, 32768, 32, 128), where the dense path leaves most SMs idle: the scalar-gate path at
  128 and 64 value columns, and its intra-card split (``SCALAR_GATE_SPLIT``) at 2, 4 and 8 runs;
* the long context of issue 15, (1, 131072, 4, 128): level 5's split against the scalar-gate split
  at 8, 16, 32 and its own rule's runs.

    FLA_FLASH_QLA=0 python results/tuning/run92-gdn.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run92"


def gdn_inputs(T, HQ, HV, D=128, seed=7):
    from kda.reference import level4 as ref4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, T, HQ, D, generator=gen, device="cuda").bfloat16()
    k = ref4.l2_normalize(torch.randn(1, T, HQ, D, generator=gen, device="cuda")).bfloat16()
    v = torch.randn(1, T, HV, D, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen, device="cuda"))
    beta = torch.rand(1, T, HV, generator=gen, device="cuda")
    return q, k, v, g, beta


def lengths(case):
    gen = torch.Generator().manual_seed(96)
    if case == "96 random lengths":
        cuts = torch.randperm(32767, generator=gen)[:95].sort().values + 1
        return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([32768])])).tolist()
    return torch.randint(1, 65, (1024,), generator=gen).tolist()


def timed(case, path, fn, ref_out=None, **extra):
    from kda.bench import median_ms
    from kda.metrics import rel_l2

    try:
        out = fn()
        row = {"ms": round(median_ms(fn), 4)}
        if ref_out is not None:
            row["rel_l2_vs_level5"] = float(f"{rel_l2(out.float(), ref_out.float()):.2e}")
    except Exception as e:
        out, row = None, {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    log(RUN, {"case": case, "path": path, **extra, **row})
    return out


def main():
    from kda import distributed, gated_delta
    from kda.gated_delta import chunk_gated_delta_rule

    gated_delta.SCALAR_GATE_MIN_BLOCKS = 0.0                 # the path wherever a switch sends it
    for case in ("96 random lengths", "1024 sequences of 1 to 64 tokens"):
        lens = lengths(case)
        q, k, v, g, beta = gdn_inputs(sum(lens), 32, 32)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        fn = lambda: chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[0]
        gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_PACKED = True, False
        base = timed(case, "level5", fn)
        gated_delta.SCALAR_GATE_PACKED = True
        for columns in (128, 64):
            gated_delta.SCALAR_GATE_COLUMNS = columns
            timed(case, "scalar", fn, base, columns=columns)
        gated_delta.SCALAR_GATE_COLUMNS, gated_delta.SCALAR_GATE_PACKED = 128, False
    q, k, v, g, beta = gdn_inputs(32768, 16, 32)
    fn = lambda: chunk_gated_delta_rule(q, k, v, g, beta)[0]
    gated_delta.SCALAR_GATE_PATH = False
    base = timed("grouped value heads 16 / 32", "level5", fn)
    gated_delta.SCALAR_GATE_PATH = True
    for columns in (128, 64):
        gated_delta.SCALAR_GATE_COLUMNS = columns
        timed("grouped value heads 16 / 32", "scalar", fn, base, columns=columns)
    for T, H, runs in ((32768, 32, (2, 4, 8)), (131072, 4, (8, 16, 32, None))):
        q, k, v, g, beta = gdn_inputs(T, H, H)
        case = f"(1, {T}, {H}, 128)"
        gated_delta.SCALAR_GATE_PATH, distributed.SCALAR_GATE_SPLIT = False, False
        base = timed(case, "level5", lambda: chunk_gated_delta_rule(q, k, v, g, beta)[0])
        timed(case, "level5 split", lambda: distributed.split_forward(q, k, v, g, beta)[0], base)
        gated_delta.SCALAR_GATE_PATH = True
        for columns in (128, 64):
            gated_delta.SCALAR_GATE_COLUMNS = columns
            timed(case, "scalar", lambda: chunk_gated_delta_rule(q, k, v, g, beta)[0], base, columns=columns)
        gated_delta.SCALAR_GATE_COLUMNS, distributed.SCALAR_GATE_SPLIT = 128, True
        for pieces in runs:
            timed(case, "scalar split", lambda: distributed.split_forward(q, k, v, g, beta, pieces=pieces)[0], base,
                  pieces=pieces)
        distributed.SCALAR_GATE_SPLIT = False
        del q, k, v, g, beta
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
