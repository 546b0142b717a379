"""Run 47 (H200, planned): the next chunks' inputs prefetched into L2.

Run 45 put the loads of q, k, g at 17% of ``chunk_intra``'s warp samples (waiting on HBM), and
the kernel holds the chunk's working set in about 110 KB of shared memory, so a second set of
input buffers for the next chunk does not fit beside it at two blocks per SM. A prefetch into L2
needs no buffer: each block, as it starts, asks L2 for the rows of q, k, v and g of the block that
will start ``ahead`` blocks after it (blocks start in order of their linear index, two per SM, so
``ahead`` = 2 x 132 is about one block's lifetime later). 640 lines of 128 bytes per chunk, two or
three ``prefetch.global.L2`` per thread. At the headline shape the L2 (50 MB) holds about 260
chunks' inputs (80 KB each), so a prefetch much further ahead would be evicted before use.

Variants (source replacements in ``kda/kernels/level5.py``): ``of record``, ``prefetch 264 ahead``,
``prefetch 528 ahead``, ``prefetch 132 ahead``. Check and time as run 43.

    python results/tuning/run47-intra-l2-prefetch.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import replaced, run_intra_variants  # noqa: E402

RUN = "run47"

PREFETCH_L2 = '''
PREFETCH_L2 = """
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
"""
'''


def prefetch(ahead):
    return [
        ("SUBCHUNK = 16\n", "SUBCHUNK = 16\n" + PREFETCH_L2),
        ("        t0 = c * C\n        L = T.min(C, S - t0)\n", f"""        t0 = c * C
        L = T.min(C, S - t0)
        T.import_source(PREFETCH_L2)
        nxt = c + NC * (bh + H * bb) + {ahead}           # the block {ahead} after this one
        c2 = nxt % NC
        h2 = (nxt // NC) % H
        b2 = nxt // (NC * H)
        tx = T.get_thread_binding()
        row = c2 * C + tx // 4                          # four threads per row
        part = tx % 4
        if b2 < B and row < S:
            T.call_extern("handle", "prefetch_l2", T.access_ptr(g[b2, row, h2, part * 32], "r"))
            if part < 2:
                T.call_extern("handle", "prefetch_l2", T.access_ptr(Q[b2, row, h2, part * 64], "r"))
                if delta:
                    T.call_extern("handle", "prefetch_l2", T.access_ptr(V[b2, row, h2, part * 64], "r"))
            else:
                T.call_extern("handle", "prefetch_l2", T.access_ptr(K[b2, row, h2, (part - 2) * 64], "r"))
"""),
    ]


VARIANTS = {"of record": [], "prefetch 264 ahead": prefetch(264), "prefetch 528 ahead": prefetch(528),
            "prefetch 132 ahead": prefetch(132)}


if __name__ == "__main__":
    run_intra_variants(RUN, list(VARIANTS), replaced(VARIANTS), sys.argv)
