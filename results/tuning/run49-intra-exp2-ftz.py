"""Run 49 (H200, planned): ``chunk_intra``'s ``exp2`` as one ``ex2.approx.ftz.f32``.

Without fast math, ``exp2f`` compiles to ``MUFU.EX2`` wrapped in a range test and two multiplies
that keep subnormal results (run 45's SASS of the scores pass: 512 ``FSETP`` and 2560 ``FMUL`` per
block beside 512 ``MUFU``); the scores pass was 16% of the warp samples. Flushing subnormal
results to zero changes no factor that matters: every factor here is a product of two numbers
<= 1 or within ``2^+-96``, so a factor below ``2^-126`` is a term below float32's range next to
the others. Every ``T.exp2`` of ``kda/kernels/level5.py`` becomes the inline PTX instruction.

Variants: ``of record``, ``ex2.approx.ftz``. Check (outputs against the kernel of record, the
output through the state pass against the float64 recurrence) and time as run 43.

    python results/tuning/run49-intra-exp2-ftz.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import intra_module, run_intra_variants  # noqa: E402

RUN = "run49"
EXP2_FTZ = '''
EXP2_FTZ = """
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def exp2_ftz(x):
    return T.call_pure_extern("float32", "exp2_ftz", x)
'''


def every_exp2(src):
    head, sep, rest = src.partition("SUBCHUNK = 16\n")
    src = head + sep + EXP2_FTZ + rest.replace("T.exp2(", "exp2_ftz(")
    anchor = "        hq = bh // value_groups if value_groups > 1 else bh\n"   # the first line of chunk_intra's body
    assert anchor in src, "chunk_intra's body moved: update run 49's anchor"
    return src.replace(anchor, "        T.import_source(EXP2_FTZ)\n" + anchor)


def module(name):
    return intra_module(name, transform=every_exp2 if name == "ex2.approx.ftz" else None)


NAMES = ["of record", "ex2.approx.ftz"]


if __name__ == "__main__":
    run_intra_variants(RUN, NAMES, module, sys.argv)
