"""Run 151 (prepared 2026-12-07): issue 15's cases that run 149 did not reach, with the register forms on.

Run 149 timed GDN's op at the two dense shapes only (its budget ran out): the packed cases (96 random lengths, 1024
sequences of 1 to 64 tokens), fla's Triton GDN at (1, 8192, 96, 128), grouped value heads (Qwen3-Next's 16 query and
key heads, 32 value heads) and the long context with few heads ((1, 131072, 4, 128), against FlashQLA's automatic
split) were last timed with the old pass. Two switches that passed their GPU tests are timed here beside the
default: ``GATE_FREE_INVERSE`` (run 147 had it slower, but its cost was warpgroup 1's gating on a chain that the
register forms have since shortened) and ``SINGLE_CHUNK_OUTPUT`` (packed sequences of at most one chunk, never timed:
run 144 ran out of memory). Packed cases first, then the long and grouped ones, the dense shapes last. Rows to
``$OUT/run151.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run151-gdn.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, script  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run151"
VARIANTS = {"default": {}, "gate_free_inverse": {"GATE_FREE_INVERSE": True},
            "single_chunk_output": {"SINGLE_CHUNK_OUTPUT": True}, "gate_free_in_split": {"GATE_FREE_IN_SPLIT": True}}


def use(variant):
    from kda.kernels import scalar_gate

    for switch in ("GATE_FREE_INVERSE", "SINGLE_CHUNK_OUTPUT", "GATE_FREE_IN_SPLIT"):
        setattr(scalar_gate, switch, VARIANTS[variant].get(switch, False))


def cases():
    """run 140's packed cases, then (1, 131072, 4, 128), grouped value heads (1, 32768, 16 / 32, 128), then run 140's
    dense shapes."""
    dense = list(run140.SHAPES)
    for case in run140.PACKED:
        lens = run140.lengths(case)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        yield case, run140.dense_inputs(1, int(cu[-1]), 32, 128), cu
    yield "dense 1x131072x4x128", run140.dense_inputs(1, 131072, 4, 128), None
    q, k, _, _, _ = run140.dense_inputs(1, 32768, 16, 128, seed=8)
    _, _, v, g, beta = run140.dense_inputs(1, 32768, 32, 128)
    yield "grouped 1x32768x16/32x128", (q, k, v, g, beta), None
    for B, T, H, D in dense:
        yield f"dense {B}x{T}x{H}x{D}", run140.dense_inputs(B, T, H, D), None


def warm_one(i):
    """Each variant's kernels compiled by one call of the op per case (a process of its own)."""
    from kda import gated_delta

    variant = list(VARIANTS)[i]
    use(variant)
    for _, (q, k, v, g, beta), cu in cases():
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return {"what": "warm", "variant": variant}


if __name__ == "__main__":
    if os.environ.get("CASES"):               # a choice of cases by the start of their names, comma-separated
        every, starts = cases, tuple(os.environ["CASES"].split(","))
        cases = lambda: (case for case in every() if case[0].startswith(starts))
    if os.environ.get("VARIANTS"):            # a choice of variants, comma-separated (run 152)
        VARIANTS = {name: VARIANTS[name] for name in os.environ["VARIANTS"].split(",")}
    if "--warm" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS), warm_one)
    run140.cases = cases                      # compare() reads run140's cases at the call
    run140.compare(RUN, list(VARIANTS), use)
