import os
import socket

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


def pytest_runtest_logreport(report):
    """With ``KDA_FAILURES_LOG`` set (the device calls), each failure's message is appended to that file as it happens,
    so that a run cut by its time limit still says why its failures failed (pytest prints them only at the end)."""
    path = os.environ.get("KDA_FAILURES_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:      # once, in the controller
        with open(path, "a") as log:
            log.write(f"{report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n\n")


@pytest.fixture
def poisoned(monkeypatch):
    """Every output of the public functions starts as NaN."""
    import kda.launch

    monkeypatch.setattr(kda.launch, "poison_outputs", True)


@pytest.fixture
def compiled_kernels(monkeypatch):
    """``{kernel name: compile kwargs}`` of every kernel compiled while the test runs (the last compile of each):
    the path a call took."""
    from kda.kernels import build

    compiled, compile_program = {}, build.compile_program
    monkeypatch.setattr(build, "compile_program",
                        lambda fn, *a, **kw: compiled.update({fn.__name__: kw}) or compile_program(fn, *a, **kw))
    return compiled


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The whole site, both languages, built once with ``mkdocs build --strict``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    site = tmp_path_factory.mktemp("site")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=root,
                         capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert res.returncode == 0, "mkdocs build --strict failed:\n" + res.stderr[-4000:]
    return site


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 nobody listens on, for the rendezvous of spawned ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
