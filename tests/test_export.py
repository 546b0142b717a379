"""``python -m kda.export``: every public op as a folder that runs without the kda package. Each
export's own test runs in a fresh interpreter that refuses any import of ``kda``: the CPU path
against the float64 recurrence, its kernels compiled for sm_90a, and (on a GPU) the kernels."""

import hashlib
import json
from pathlib import Path

import pytest

from kda import export
from kda.catalog import OPS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.tilelang
@pytest.mark.parametrize("op", sorted(OPS))
def test_an_exported_op_passes_its_own_test_without_kda(op, tmp_path):
    folder = export.export(op, tmp_path)
    res = export.run_exported_test(folder)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "needs tilelang and nvcc" not in res.stdout, "the kernel compile test was skipped"
    passed = int(res.stdout.splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= len(OPS[op].kernels) + 1          # + 1 on a GPU: the CUDA check


def test_the_export_records_where_it_came_from(tmp_path):
    folder = export.export("delta_rule", tmp_path)
    source = json.loads((folder / "SOURCE.json").read_text())
    assert source["tilelang"] == "0.1.15" and source["verified_on"] == export.VERIFIED_ON
    assert "kda/delta.py" in source["files"] and "kda/kernels/wy_solve.py" in source["files"]
    for rel, digest in source["files"].items():
        assert hashlib.sha256((ROOT / rel).read_bytes()).hexdigest() == digest, rel
    copied = (folder / "delta.py").read_text()
    assert "from kda_delta_rule import cuda_autograd, validate" in copied and "from kda " not in copied


def test_imports_are_renamed_and_nothing_else():
    source = "from kda import ops\nimport kda.reference.level4 as ref4\n    from kda.kernels import chunk_intra\nx = 'kda.ops'\n"
    assert export.rename_imports(source, "pkg") == (
        "from pkg import ops\nimport pkg.reference.level4 as ref4\n    from pkg.kernels import chunk_intra\nx = 'kda.ops'\n")


def test_an_unknown_op_is_refused(tmp_path):
    with pytest.raises(ValueError, match="op must be one of .*chunk_kda"):
        export.export("kda_forward", tmp_path)


def test_the_folder_is_the_package_and_imports_from_its_parent(tmp_path):
    """``DIR/kda_<op>/`` is itself the package: from ``DIR``, ``from kda_<op> import <op>`` gives the
    function, in an interpreter that refuses every import of ``kda``."""
    import subprocess
    import sys

    export.export("delta_rule", tmp_path)
    program = export.WITHOUT_KDA.split("import pytest")[0] + (
        "from kda_delta_rule import delta_rule\nprint(delta_rule.__module__)\n")
    res = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "kda_delta_rule.delta"


def test_the_export_works_from_a_checkout_that_pip_did_not_install(tmp_path, monkeypatch):
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(export.metadata, "requires", not_installed)
    assert export._tilelang_pin() == "0.1.15"
    assert (export.export("delta_rule", tmp_path) / "requirements.txt").read_text().count("tilelang==0.1.15") == 1


def test_a_failed_exported_test_raises_with_its_output(tmp_path, monkeypatch):
    folder = export.export("delta_rule", tmp_path)
    (folder / "test_kda_delta_rule.py").write_text("raise ImportError('no module named pytest_probe')\n")
    with pytest.raises(RuntimeError, match="no module named pytest_probe"):
        export.run_exported_test(folder, check=True)
