"""Compiling TileLang programs: the target, a per-process cache, and the ptxas report.

tilelang 0.1.15 rejects target strings such as ``"cuda -arch=sm_90a"``; a dict works.
Without a GPU and without a target it would pick sm_50 and another GEMM path, so the
CPU tests always name ``SM90A``.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SM90A = {"kind": "cuda", "arch": "sm_90a"}


def device_target() -> dict:
    """The target of the current CUDA device (``sm_90a`` on Hopper), else ``SM90A``."""
    import torch

    if not _cuda_available():
        return dict(SM90A)
    return dict(_target_of(torch.cuda.current_device()))


@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    # asked once: torch.cuda.is_available() asks NVML or the driver each time, and every launch looks its kernel up
    # through device_target (run 115: about a tenth of the split's host time went to such queries)
    import torch

    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _target_of(index: int) -> tuple:
    # Asked once per device: the capability query is a driver call, and every kernel launch of
    # every public function looks its kernel up through this (run 48 in results/tuning).
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return (("arch", f"sm_{major}{minor}" + ("a" if major == 9 else "")), ("kind", "cuda"))


def _key(target: dict) -> tuple:
    return tuple(sorted(target.items()))


@functools.lru_cache(maxsize=None)
def _compile(program_fn, target_key: tuple, out_idx: tuple, pass_configs: tuple, params: tuple):
    import tilelang

    program = program_fn(**dict(params))
    configs = {**getattr(program_fn, "pass_configs", {}), **dict(pass_configs)}
    return tilelang.compile(program, out_idx=list(out_idx) or None, target=dict(target_key),
                            pass_configs=configs or None,
                            compile_flags=list(getattr(program_fn, "compile_flags", ())) or None)


def compile_program(program_fn, out_idx, target: dict | None = None, pass_configs: dict | None = None,
                    **params):
    """Compile ``program_fn(**params)`` once per process for ``target`` (default: the GPU's), with
    the nvcc flags the factory names in its attribute ``compile_flags`` and the tilelang pass
    configs of its attribute ``pass_configs`` (those given here win), if it has them."""
    target_key = _key(device_target() if target is None else target)
    return _compile(program_fn, target_key, tuple(out_idx), tuple(sorted((pass_configs or {}).items())),
                    tuple(sorted(params.items())))


_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


# --8<-- [start:warp_specialised]
# For kernels warp-specialised by hand: tilelang plans shared memory by the order of the statements,
# so a buffer used only in one warpgroup's branch and one used only in a later branch look disjoint
# in time and may share bytes, while the branches run at the same time. Run 61 in results/tuning
# found level 3's scalar pass giving wrong outputs that way (the chain's weighted V and the output's
# staging tile at one address). Each buffer gets bytes of its own with this.
WARP_SPECIALISED = {"tl.disable_shared_memory_reuse": True}
# --8<-- [end:warp_specialised]


def ptxas_report(kernel, arch: str = "sm_90a") -> dict:
    """Registers, stack and spills of a compiled kernel, read from ``ptxas -v``.

    On warp-specialised kernels the count is the ``setmaxnreg`` ceiling of the consumer
    warpgroup, not the pressure; spills are what to watch.
    """
    return ptxas_of(kernel._get_ptx(), arch)


def ptxas_of(ptx_text: str, arch: str = "sm_90a") -> dict:
    """``ptxas_report`` of PTX text (``kda.kernels.registers`` asks it of edited PTX); raises
    ``subprocess.CalledProcessError`` where ptxas rejects the PTX."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(ptx_text)
        res = subprocess.run([ptxas, f"-arch={arch}", "-v", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = res.stdout + res.stderr
    regs = _PTXAS_USED.search(text)
    spill = _PTXAS_SPILL.search(text)
    if regs is None or spill is None:
        raise RuntimeError(f"unexpected ptxas output:\n{text}")
    return {"registers": int(regs.group(1)), "stack_bytes": int(spill.group(1)),
            "spill_store_bytes": int(spill.group(2)), "spill_load_bytes": int(spill.group(3))}


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA ``device``, asked once per device (launchers choose
    their grids by it on every call)."""
    import torch

    device = torch.device(device)
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
