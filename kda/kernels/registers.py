"""How many registers a warp-specialised kernel really needs.

tilelang splits these kernels into a producer warpgroup (TMA only, ``setmaxnreg.dec 24``) and a
consumer warpgroup (``setmaxnreg.inc 240``), so ``ptxas -v`` reports the 240 that the consumer
is allowed, not what it needs. Rewriting the ``setmaxnreg.inc`` value in the PTX and asking
ptxas again, for budgets in steps of 8 (the granularity of ``setmaxnreg``), finds the smallest
budget the consumer code fits in without spilling.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

INC = re.compile(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+);")


def _ptxas(ptx: str, arch: str) -> tuple[int, int]:
    """(registers, spill store bytes) that ptxas reports for ``ptx``."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        res = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = res.stdout + res.stderr
    return (int(re.search(r"Used (\d+) registers", text).group(1)),
            int(re.search(r"(\d+) bytes spill stores", text).group(1)))


def consumer_budget(kernel, arch: str = "sm_90a") -> dict:
    """``{"declared": n, "smallest_without_spills": m}`` for the consumer warpgroup, or ``None``
    values when the kernel is not warp-specialised."""
    ptx = kernel._get_ptx()
    found = INC.search(ptx)
    if found is None:
        return {"declared": None, "smallest_without_spills": None}
    declared = int(found.group(1))
    smallest = None
    for budget in range(declared, 23, -8):                   # from the declared budget down
        _, spills = _ptxas(INC.sub(f"setmaxnreg.inc.sync.aligned.u32 {budget};", ptx), arch)
        if spills:
            break
        smallest = budget
    return {"declared": declared, "smallest_without_spills": smallest}
