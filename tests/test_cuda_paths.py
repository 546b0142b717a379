"""CUDA paths that land before their GPU tests (kda.cuda_paths): off by default until the commit
that adds their GPU test log, and a call that needs one that is off raises a clear error."""

import sys
import types
from pathlib import Path

import pytest

from kda import cuda_paths

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", cuda_paths.PATHS, ids=[p.name for p in cuda_paths.PATHS])
def test_a_switch_is_on_by_default_only_with_its_gpu_test_log(path):
    assert isinstance(getattr(__import__(path.module, fromlist=["_"]), path.switch), bool)
    if path.gpu_log is None:
        assert not cuda_paths.enabled(path), f"{path.module}.{path.switch} is on without a GPU test log"
    else:
        assert (ROOT / path.gpu_log).is_file(), f"{path.name}: {path.gpu_log} does not exist"
        assert path.gpu_log.startswith("results/")
    assert path.what["en"] and path.what["zh"]


def test_a_path_that_is_off_raises_naming_its_switch(monkeypatch):
    module = types.ModuleType("kda_fake_stage")
    module.FAST_STAGE = False
    monkeypatch.setitem(sys.modules, "kda_fake_stage", module)
    path = cuda_paths.CudaPath("fake_stage", "kda_fake_stage", "FAST_STAGE", {"en": "a stage", "zh": "一个阶段"})
    assert cuda_paths.unverified([path]) == [path]
    with pytest.raises(NotImplementedError, match=r"kda_fake_stage\.FAST_STAGE = True.*CPU tensors"):
        cuda_paths.require(path, "chunk_kda's backward")
    module.FAST_STAGE = True
    cuda_paths.require(path, "chunk_kda's backward")             # on: no error
    logged = cuda_paths.CudaPath("fake_stage", "kda_fake_stage", "FAST_STAGE", path.what, "results/x.txt")
    assert cuda_paths.unverified([path, logged]) == [path]
    module.FAST_STAGE = False                                     # tested, but off where it is slower
    assert cuda_paths.tested_but_off([path, logged]) == [logged]
    with pytest.raises(NotImplementedError, match=r"passed its GPU tests \(results/x\.txt\).*= True to use it"):
        cuda_paths.require(logged, "chunk_kda's backward")
