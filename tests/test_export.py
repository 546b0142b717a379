"""``python -m kda.export``: every public op as a folder that runs without the kda package. Each
export's own test runs in a fresh interpreter that refuses any import of ``kda``: the CPU path
against the float64 recurrence, its kernels compiled for sm_90a, and (on a GPU) the kernels."""

import hashlib
import json
from pathlib import Path

import pytest

from kda import export

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.tilelang
@pytest.mark.parametrize("op", sorted(export.OPS))
def test_an_exported_op_passes_its_own_test_without_kda(op, tmp_path):
    folder = export.export(op, tmp_path)
    res = export.run_exported_test(folder)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "needs tilelang and nvcc" not in res.stdout, "the kernel compile test was skipped"
    passed = int(res.stdout.splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= len(export.OPS[op].kernels) + 1          # + 1 on a GPU: the CUDA check


def test_the_export_records_where_it_came_from(tmp_path):
    folder = export.export("delta_rule", tmp_path)
    source = json.loads((folder / "SOURCE.json").read_text())
    assert source["tilelang"] == "0.1.15" and source["verified_on"] == export.VERIFIED_ON
    assert "kda/delta.py" in source["files"] and "kda/kernels/level4.py" in source["files"]
    for rel, digest in source["files"].items():
        assert hashlib.sha256((ROOT / rel).read_bytes()).hexdigest() == digest, rel
    copied = (folder / "kda_delta_rule" / "delta.py").read_text()
    assert "from kda_delta_rule import ops, validate" in copied and "from kda " not in copied


def test_imports_are_renamed_and_nothing_else():
    source = "from kda import ops\nimport kda.reference.level4 as ref4\n    from kda.kernels import level5\nx = 'kda.ops'\n"
    assert export.rename_imports(source, "pkg") == (
        "from pkg import ops\nimport pkg.reference.level4 as ref4\n    from pkg.kernels import level5\nx = 'kda.ops'\n")


def test_an_unknown_op_is_refused(tmp_path):
    with pytest.raises(ValueError, match="op must be one of .*chunk_kda"):
        export.export("kda_forward", tmp_path)
