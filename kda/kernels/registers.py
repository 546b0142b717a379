"""How many registers a warp-specialised kernel really needs.

tilelang splits these kernels into a producer warpgroup (TMA only, ``setmaxnreg.dec 24``) and a
consumer warpgroup (``setmaxnreg.inc 240``), so ``ptxas -v`` reports the 240 that the consumer
is allowed, not what it needs. Rewriting the ``setmaxnreg.inc`` value in the PTX and asking
ptxas again, for budgets in steps of 8 (the granularity of ``setmaxnreg``), finds the smallest
budget the consumer code fits in without spilling. The budgets are bisected (five ptxas runs
instead of up to 28): fewer registers never spill less, and the tables of levels 1 to 3 came out
the same as with the scan from the declared budget down that this replaced.
"""

from __future__ import annotations

import re
import subprocess

from kda.kernels.build import ptxas_of

INC = re.compile(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+);")


def _smallest_budget(ptx: str, arch: str) -> dict:
    found = INC.search(ptx)
    if found is None:
        return {"declared": None, "smallest_without_spills": None}
    declared = int(found.group(1))
    budgets = list(range(declared, 23, -8))[::-1]            # 24 (setmaxnreg's floor) .. declared

    def spills(budget):                  # ptxas rejects some budgets outright: they do not fit either
        try:
            return ptxas_of(INC.sub(f"setmaxnreg.inc.sync.aligned.u32 {budget};", ptx), arch)["spill_store_bytes"]
        except subprocess.CalledProcessError:
            return True
    if spills(budgets[-1]):
        return {"declared": declared, "smallest_without_spills": None}
    lo, hi = 0, len(budgets) - 1                             # fewer registers never spill less: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if spills(budgets[mid]) else (lo, mid)
    return {"declared": declared, "smallest_without_spills": budgets[lo]}


def report(kernel, arch: str = "sm_90a") -> dict:
    """``ptxas -v`` of a compiled kernel (registers, stack, spills) and, for a warp-specialised
    one, the consumer's ``declared`` budget and the ``smallest_without_spills``; ``None`` values
    when it is not warp-specialised. One PTX for all of it (each ``_get_ptx`` runs nvcc again)."""
    ptx = kernel._get_ptx()
    return {**ptxas_of(ptx, arch), **_smallest_budget(ptx, arch)}
