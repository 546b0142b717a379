"""Run 148 (prepared 2026-12-07): GDN's first kernel with the heads first in its grid and fewer chunks a block.

Run 94 prepared this on 2026-12-03 and never ran; the kernel has changed since (the merge by halves, the cumsum by
scan, the compact shared memory, four blocks an SM). FlashQLA's ``kkt_solve`` (one chunk a block of 128 threads, the
heads fastest in its grid) takes 0.17 ms at (1, 8192, 96, 128) where ``chunk_gated_inverse`` takes 0.21 to 0.24 (runs
135 and 140, H100). ``heads_first`` puts the heads on the grid's first axis, so that blocks launched together read
the same 64 rows of neighbouring heads; ``chunks_per_block`` 1, 2 and 8 against today's 4. The arithmetic is the same:
``G`` and ``Tb`` must equal the default's bit for bit. Run 90's script times each variant at the two shapes of issue 15
and then the op with the fastest; FlashQLA's ``kkt_solve`` is timed beside at each shape. Stage ``gate_free``: the op
with ``scalar_gate.GATE_FREE_INVERSE`` off and on (the first kernel without the gate, the pass gating it), its outputs against the gated inverse's, beside FlashQLA's op (its first kernel also in the variants above).
Rows to ``$OUT/run148.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run148-inverse.py compile time gate_free
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import script  # noqa: E402

run90 = script("run90-gdn-inverse.py")
run140 = script("run140-gdn.py")

from kda.kernels.scalar_gate import COMPACT_INVERSE, SCALAR_GATE_INVERSE_CONFIG  # noqa: E402

RUN = run90.RUN = "run148"
BASE = {**SCALAR_GATE_INVERSE_CONFIG, **COMPACT_INVERSE}
VARIANTS = run90.VARIANTS = {
    "default": BASE,
    "heads_first": {**BASE, "heads_first": True},
    "heads_first, 1 chunk a block": {**BASE, "heads_first": True, "chunks_per_block": 1},
    "heads_first, 2 chunks a block": {**BASE, "heads_first": True, "chunks_per_block": 2},
    "1 chunk a block": {**BASE, "chunks_per_block": 1},
    "2 chunks a block": {**BASE, "chunks_per_block": 2},
    "8 chunks a block": {**BASE, "chunks_per_block": 8},
    "gate_free (not the same output)": {**BASE, "gate_free": True},
}
run90.SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]


def compile_one(i):
    """Run 90's, here: the spawned processes import this file, not run 90's (its name has a dash)."""
    import time

    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program, ptxas_report
    name, params = list(VARIANTS.items())[i]
    t = time.time()
    kernel = compile_program(scalar_gate.chunk_gated_inverse, (), DK=128, dtype="bfloat16", **params)
    return {"what": "compile", "variant": name, "s": round(time.time() - t, 1), **ptxas_report(kernel)}


def flash_qla_kkt_solve():
    """FlashQLA's first kernel at each shape, on the inputs run 90's script draws."""
    import torch
    from flash_qla.ops.gated_delta_rule.chunk.hopper.kkt_solve import kkt_solve

    from harness import log
    from kda.bench import median_ms

    for B, T, H, D in run90.SHAPES:
        k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).bfloat16()
        beta = torch.rand(B, T, H, device="cuda")
        log(RUN, {"what": "inverse", "B": B, "T": T, "H": H, "D": D, "variant": "FlashQLA kkt_solve",
                  "ms": round(median_ms(lambda: kkt_solve(k, beta)), 4)})


def gate_free_op():
    """GDN's op with ``scalar_gate.GATE_FREE_INVERSE`` off and on beside FlashQLA's op."""
    import torch
    from flash_qla.ops.gated_delta_rule import chunk_gated_delta_rule as flash_qla_gdn

    from harness import log
    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import scalar_gate
    from kda.metrics import rel_l2

    for B, T, H, D in run90.SHAPES:
        q, k, v, g, beta = run140.dense_inputs(B, T, H, D)
        case = {"what": "op", "B": B, "T": T, "H": H, "D": D}
        outs = {}
        for gate_free in (False, True):
            scalar_gate.GATE_FREE_INVERSE = gate_free
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
            outs[gate_free] = fn()
            log(RUN, {**case, "impl": f"kda gate_free={gate_free}", "ms": round(median_ms(fn), 4)})
        scalar_gate.GATE_FREE_INVERSE = False
        log(RUN, {**case, "gate_free_vs_gated": [rel_l2(outs[True][i], outs[False][i]) for i in range(2)]})
        fq = lambda: flash_qla_gdn(q, k, v, g, beta, output_final_state=True)
        log(RUN, {**case, "impl": "FlashQLA", "ms": round(median_ms(fq), 4)})


if __name__ == "__main__":
    from harness import compile_in_processes

    stages = {"compile": lambda: compile_in_processes(RUN, len(VARIANTS), compile_one),
              "time": lambda: (flash_qla_kkt_solve(), run90.time_variants()), "gate_free": gate_free_op}
    for stage in sys.argv[1:]:
        stages[stage]()
