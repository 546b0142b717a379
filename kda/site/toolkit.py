"""The CUDA tools a CPU build calls: ``nvcc`` (tilelang compiles every kernel for sm_90a) and
``ptxas`` (the register tables). Without a system toolkit, the ``cuda`` extra installs NVIDIA's
pip packages (``nvidia-cuda-nvcc`` and the headers it needs); tilelang finds that ``nvcc`` by
itself when none is on ``PATH``, and ``cuda_tools_on_path`` puts the same ``bin/`` on ``PATH``
for ``ptxas``. Snippets run as child processes and inherit it."""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path


def pip_toolkit_bin() -> Path | None:
    """``bin/`` of the pip package ``nvidia-cuda-nvcc`` (13.0 or later ships nvcc and ptxas)."""
    try:
        files = metadata.files("nvidia-cuda-nvcc") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "ptxas":
            return Path(f.locate()).parent
    return None


def cuda_tools_on_path() -> Path | None:
    """If ``ptxas`` is not on ``PATH``, prepend the toolkit's ``bin/`` (``$CUDA_HOME``, else the
    pip package); returns the directory added, ``None`` if nothing was needed or found."""
    if shutil.which("ptxas"):
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = ([Path(home) / "bin"] if home else []) + [pip_toolkit_bin()]
    for bin_dir in candidates:
        if bin_dir is not None and (bin_dir / "ptxas").is_file():
            os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
            return bin_dir
    return None
