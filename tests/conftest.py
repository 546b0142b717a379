import pytest
import torch


def _has_tilelang() -> bool:
    try:
        import tilelang  # noqa: F401
    except Exception:
        return False
    return True


HAS_TILELANG = _has_tilelang()
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU and tilelang")
    skip_tl = pytest.mark.skip(reason="needs tilelang (pip install -e '.[gpu]')")
    for item in items:
        if "gpu" in item.keywords and not (HAS_CUDA and HAS_TILELANG):
            item.add_marker(skip_gpu)
        if "tilelang" in item.keywords and not HAS_TILELANG:
            item.add_marker(skip_tl)


@pytest.fixture
def poisoned(monkeypatch):
    """Every output of the public functions starts as NaN."""
    import kda.ops

    monkeypatch.setattr(kda.ops, "poison_outputs", True)
