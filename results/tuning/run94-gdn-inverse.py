"""Run 94 (H200, prepared 2026-12-03, not yet run): the grid order of GDN's first kernel.

FlashQLA's ``kkt_solve`` takes 0.174 ms at (1, 8192, 96, 128) where ``chunk_gated_inverse`` takes 0.350
(run 90). One difference costs nothing to try: FlashQLA's grid has the heads fastest, so the blocks that
run together read the same tokens of neighbouring heads (one stretch of ``[B, T, H, D]`` memory), where
ours has the chunks fastest, each block reading 64 rows 24 KB apart. ``heads_first`` swaps the order; the
arithmetic is the same, so ``G`` and ``Tb`` must equal the default's bit for bit. Run 90's script does the
rest (compile in parallel, time each variant, then the op with the best one against level 5's path).

    FLA_FLASH_QLA=0 python results/tuning/run94-gdn-inverse.py compile time
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
spec = importlib.util.spec_from_file_location("run90_gdn_inverse", os.path.join(HERE, "run90-gdn-inverse.py"))
run90 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run90)

RUN = run90.RUN = "run94"
VARIANTS = run90.VARIANTS = {
    "default": {},
    "heads_first": dict(heads_first=True),
    "heads_first_cpb1": dict(heads_first=True, chunks_per_block=1),
    "heads_first_cpb2": dict(heads_first=True, chunks_per_block=2),
    "heads_first_cpb8": dict(heads_first=True, chunks_per_block=8),
    "cpb1": dict(chunks_per_block=1),
}
run90.SHAPES = [(1, 8192, 96, 128), (4, 4096, 64, 128), (1, 32768, 32, 128)]



def compile_one(i):
    """Run 90's, here: the spawned processes import this file, not run 90's (its name has a dash)."""
    import time

    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program, ptxas_report
    name, params = list(VARIANTS.items())[i]
    t = time.time()
    kernel = compile_program(scalar_gate.chunk_gated_inverse, (), DK=128, dtype="bfloat16", **params)
    return {"what": "compile", "variant": name, "s": round(time.time() - t, 1), **ptxas_report(kernel)}


if __name__ == "__main__":
    from harness import compile_in_processes

    stages = {"compile": lambda: compile_in_processes(RUN, len(VARIANTS), compile_one), "time": run90.time_variants}
    for stage in sys.argv[1:]:
        stages[stage]()
