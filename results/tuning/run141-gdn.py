"""Run 141 (prepared 2026-12-06): run 140 again with the pass's fix. Run 140 found the barrier-free pass 40% slower
(0.714 ms against 0.509 at (1, 8192, 96, 128)): V' made in the registers that held X kept both tiles alive, 128
registers of the warpgroup's 128, and ptxas spilled 488 bytes. Now V_new goes out first and V' is made over it
(no spill, no barrier in any step, on the CPU). The same comparison as run 140's (``run140-gdn.py``: the old kernels
rebuilt from today's source with the edits undone, outputs bit for bit, kernel by kernel), at (1, 8192, 96, 128) and
96 packed sequences of random lengths, beside FlashQLA. Rows to ``$OUT/run141.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run141-gdn.py --warm
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("run140_gdn", os.path.join(HERE, "run140-gdn.py"))
run140 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run140)

OLD_WG1 = """                    for i, jj in T.Parallel(C, BV):
                        v_s[slot, i, jj] = v_s[slot, i, jj] - E_s[slot, i] * KS[i, jj]
                    T.fence_proxy_async()
                    T.gemm(tb_s[slot, :, :], v_s[slot, :, :], VD, clear_accum=True)
                    for i, jj in T.Parallel(C, BV):
                        vn_s[i, jj] = VD[i, jj] * R_s[slot, i]
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    T.barrier_wait(vd_free, (j + 1) % 2)
                    T.copy(VD, vd_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(vd_ready)
"""


def new_wg1():
    """Today's lines of warpgroup 1 from its comment to ``vn_ready``'s arrival."""
    text = open(os.path.join(run140.ROOT, "kda/kernels/scalar_gate.py")).read()
    first = text.index("                    # X and V' in registers")
    last = text.index("T.barrier_arrive(vn_ready)\n", first) + len("T.barrier_arrive(vn_ready)\n")
    return text[first:last]


run140.RUN = "run141"
run140.SHAPES = [(1, 8192, 96, 128)]
run140.PACKED = ["96 random lengths"]
run140.UNDO["kda/kernels/scalar_gate.py"] = [
    (new_wg1(), OLD_WG1),
    ("from kda.kernels.merge_by_halves import merge_by_halves", "from run140_merge_in_place import merge_by_halves"),
]

if __name__ == "__main__":
    if "--warm" in sys.argv:
        run140.compile_in_processes(run140.RUN, 2, run140.warm_one)
    run140.main()
