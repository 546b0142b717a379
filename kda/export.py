"""``python -m kda.export <op> <dir>``: one public op as a folder that runs without ``kda``.

The folder is the package ``kda_<op>`` (the op's module and every ``kda`` module it imports,
kernels, input checks and float64 references, with the imports renamed): from its parent folder,
``from kda_<op> import <op>``. Beside the modules it holds a test ``test_kda_<op>.py`` (the CPU
path against the float64 token recurrence, the kernels compiled for sm_90a, the CUDA path against
the recurrence where there is a GPU), ``requirements.txt`` with the pinned tilelang, and
``SOURCE.json``: the commit and the SHA-256 of every file it was cut from.

    python -m kda.export chunk_kda vendor/
    python -m pytest vendor/kda_chunk_kda/test_kda_chunk_kda.py
    cd vendor && python -c "from kda_chunk_kda import chunk_kda"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from kda.catalog import OPS
from kda.site.snippets import git_commit, kda_closure

KDA = Path(__file__).resolve().parent
VERIFIED_ON = "NVIDIA H200 (Hopper, sm_90a)"     # where every GPU test and record of the site ran


def closure(module: str) -> list[Path]:
    """The file of ``module`` and of every ``kda`` module it imports, transitively (the same walk
    that keys the site's snippets to the code they run), sorted."""
    file = KDA.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return sorted({file, *kda_closure(file.read_text(encoding="utf-8"))})


IMPORT = re.compile(r"^(\s*)(from|import)\s+kda(?=[.\s])", re.MULTILINE)


def rename_imports(source: str, package: str) -> str:
    """``from kda.x import y`` -> ``from <package>.x import y`` (and ``import kda.x``)."""
    return IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {package}", source)


def _tilelang_pin() -> str:
    """The tilelang version kda pins: from its installed metadata, or from the checkout's
    pyproject.toml where kda is imported from a source tree that pip did not install."""
    try:
        requirements = metadata.requires("kda") or []
    except metadata.PackageNotFoundError:
        pyproject = KDA.parent / "pyproject.toml"
        requirements = re.findall(r'"(tilelang\s*==[^"]+)"', pyproject.read_text()) if pyproject.exists() else []
    for req in requirements:
        m = re.match(r"tilelang\s*==\s*([\w.]+)", req)
        if m:
            return m.group(1)
    raise RuntimeError("kda pins no tilelang version (neither its metadata nor pyproject.toml)")


TEST = '''"""The exported {name}: the CPU path against the float64 token recurrence, the kernels compiled
for sm_90a (nvcc only, no GPU needed), and on a GPU the kernels against the recurrence.
Written by kda.export; runs without the kda package."""

from pathlib import Path

import pytest
import torch

from {package} import {name}
from {package}.reference.level4 import l2_normalize
from {package}.reference.{reference} import recurrent

KERNELS = {kernels!r}


def has_nvcc():
    try:
        import tilelang
    except ImportError:
        return False
    return bool(tilelang.env.CUDA_HOME) and (Path(tilelang.env.CUDA_HOME) / "bin" / "nvcc").exists()


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def inputs(device, dtype, B=2, T=100, H=2, DK=16, DV=8, seed=0):
    """q, v unit normal, unit-norm keys, gates logsigmoid(x) per channel (g) or per head
    (g_head), decays in [0.5, 1] per head, beta in [0, 1], a random initial state."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, v = rand(B, T, H, DK), l2_normalize(rand(B, T, H, DK)), rand(B, T, H, DV)
    g, g_head = torch.nn.functional.logsigmoid(rand(B, T, H, DK)), torch.nn.functional.logsigmoid(rand(B, T, H))
    beta, h0 = torch.rand(B, T, H, generator=gen, dtype=torch.float64), rand(B, H, DK, DV)
    alpha = 0.5 + 0.5 * torch.rand(H, generator=gen, dtype=torch.float64)
    q, k, v = (x.to(device, dtype) for x in (q, k, v))
    g, g_head, beta, h0 = (x.to(device, torch.float32) for x in (g, g_head, beta, h0))
    return q, k, v, g, g_head, alpha, beta, h0, DK ** -0.5


def check(q, k, v, g, g_head, alpha, beta, h0, scale, bound):
    o, final = {call}
    q, k, v, g, g_head, beta, h0 = (x.double() for x in (q, k, v, g, g_head, beta, h0))
    ref_o, ref_final = {ref_call}
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    assert rel_l2(o, ref_o) <= bound, f"o: {{rel_l2(o, ref_o):.2e}}"
    assert rel_l2(final, ref_final) <= bound, f"final state: {{rel_l2(final, ref_final):.2e}}"


def test_cpu_against_the_token_recurrence():
    check(*inputs("cpu", torch.float64), bound=1e-6)


@pytest.mark.skipif(not has_nvcc(), reason="needs tilelang and nvcc (a CUDA toolkit, or pip install nvidia-cuda-nvcc)")
@pytest.mark.parametrize("module,factory,params", KERNELS)
def test_kernels_compile_for_sm90a(module, factory, params):
    import importlib

    import tilelang

    program = getattr(importlib.import_module(f"{package}.kernels.{{module}}"), factory)(**params)
    tilelang.compile(program, target={{"kind": "cuda", "arch": "sm_90a"}})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_against_the_token_recurrence():
    check(*inputs("cuda", torch.bfloat16, T=200, DK=64, DV=64), bound=5e-3)
'''

README = """# kda_{name}

`{name}` from the `kda` package of *KDA from zero to one*, as a package of its own: the TileLang
kernels, the launcher with its input checks, and the float64 references it is tested against.
Cut by `python -m kda.export {name}` from commit `{commit}` (`SOURCE.json` lists every file with
its SHA-256). Verified on: {verified}. The kernels are written for Hopper (TMA, wgmma); other
GPUs were not tried. tilelang compiles them on first use with nvcc: a CUDA toolkit on PATH, or
`pip install nvidia-cuda-nvcc` (13.0 or later).

This folder is the package: put its parent folder on the import path (or copy the folder into
your project's source tree), then

```python
from kda_{name} import {name}
```

and check it where it landed:

    pip install -r kda_{name}/requirements.txt
    python -m pytest kda_{name}/test_kda_{name}.py
"""


def export(name: str, dest: Path) -> Path:
    """Write ``dest/kda_<name>/`` for the public op ``name``; returns that folder."""
    if name not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)}, got {name!r}")
    op = OPS[name]
    package = f"kda_{name}"
    folder = Path(dest) / package
    if folder.exists():
        shutil.rmtree(folder)
    roots = [f"kda.{op.module}", f"kda.reference.{op.reference}", "kda.reference.level4"]
    roots += sorted({f"kda.kernels.{m}" for m, _, _ in op.kernels})
    files = {}
    for src in sorted(set().union(*(closure(r) for r in roots))):
        rel = src.resolve().relative_to(KDA)
        out = folder / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        for parent in rel.parents:
            (folder / parent / "__init__.py").touch()
        out.write_text(rename_imports(src.read_text(encoding="utf-8"), package), encoding="utf-8")
        files[f"kda/{rel.as_posix()}"] = hashlib.sha256(src.read_bytes()).hexdigest()
    (folder / "__init__.py").write_text(
        f'"""{name}, exported from kda (SOURCE.json beside this package)."""\n\n'
        f"from {package}.{op.module} import {name}\n\n__all__ = [\"{name}\"]\n", encoding="utf-8")
    (folder / f"test_{package}.py").write_text(TEST.format(
        name=name, package=package, reference=op.reference, kernels=list(op.kernels), call=op.call,
        ref_call=op.ref_call), encoding="utf-8")
    commit, tilelang = git_commit(KDA.parent), _tilelang_pin()
    (folder / "requirements.txt").write_text(f"torch\ntilelang=={tilelang}\npytest\n", encoding="utf-8")
    (folder / "README.md").write_text(README.format(name=name, commit=commit or "unknown", verified=VERIFIED_ON),
                                      encoding="utf-8")
    (folder / "SOURCE.json").write_text(json.dumps(
        {"op": name, "package": package, "kda_commit": commit, "tilelang": tilelang,
         "verified_on": VERIFIED_ON, "files": files}, indent=1) + "\n", encoding="utf-8")
    return folder


WITHOUT_KDA = """
import sys
class NoKda:
    def find_spec(self, name, path=None, target=None):
        if name == "kda" or name.startswith("kda."):
            raise ImportError(f"the exported folder imported {name}")
sys.meta_path.insert(0, NoKda())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def run_exported_test(folder: Path, *pytest_args: str, check: bool = False) -> subprocess.CompletedProcess:
    """The export's own test in a fresh interpreter that refuses every import of ``kda``, run from
    the folder's parent as a user would; with ``check``, a run that fails raises with its output
    (pytest missing, say), so a caller never parses the output of a run that did not happen."""
    test = next(Path(folder).glob("test_kda_*.py"))
    res = subprocess.run([sys.executable, "-c", WITHOUT_KDA, "-q", "-p", "no:cacheprovider", "-rs",
                          f"{Path(folder).name}/{test.name}", *pytest_args], cwd=Path(folder).parent,
                         capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"the exported test of {Path(folder).name} failed (exit {res.returncode}):\n"
                           + (res.stdout[-2000:] + res.stderr[-2000:]).strip())
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("op", choices=sorted(OPS))
    parser.add_argument("dir", type=Path, help="where to write kda_<op>/")
    args = parser.parse_args(argv)
    folder = export(args.op, args.dir)
    print(f"wrote {folder} ({len(list(folder.rglob('*.py')))} Python files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
