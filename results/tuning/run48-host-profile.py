"""Run 48 (H200, planned): where the host time of one ``chunk_kda`` call goes.

At (1, 64, 1, 128) the GPU work is a few microseconds and a call took 0.145 ms (0.121 with
``check_values=False``, run 38); with the read-back of the value flags the next call's host work
is not hidden behind the GPU, and the level-5 record of 481ea2d shows the checked call 0.15 to 0.32
ms slower than the unchecked one. The argument checks take 6 us on the CPU; the rest is launches,
allocations and lookups that need the GPU to measure. cProfile over 2000 calls, both ways, sorted
by own time and by cumulative time, into ``$OUT/run48-*.txt``; the median per call as a JSON line.

    python results/tuning/run48-host-profile.py
"""
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import OUT, ROOT, log  # noqa: E402

RUN = "run48"


def main():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms, random_qkv
    q, k, v = random_qkv(1, 64, 1, 128, 128)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 64, 1, 128, device="cuda"))
    beta = torch.rand(1, 64, 1, device="cuda")
    for check in (True, False):
        call = lambda: chunk_kda(q, k, v, g, beta, check_values=check)
        log(RUN, {"what": "chunk_kda (1, 64, 1, 128)", "check_values": check, "ms": median_ms(call)})
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            call()
        torch.cuda.synchronize()
        prof.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(40)
            with open(os.path.join(OUT, f"run48-{'checked' if check else 'unchecked'}-{order}.txt"), "w") as f:
                f.write(text.getvalue())


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
