"""``kda.catalog``, the one table of public ops, against the tree: every name in a row resolves, every file
exists and speaks of its op, and the kernels a row lists are the ones the op's CUDA path launches."""

import contextlib
import importlib
from pathlib import Path

import pytest
import torch

import kda
from kda.catalog import OPS

ROOT = Path(__file__).resolve().parents[1]


def resolve(dotted: str):
    """``a.b.c`` as the attribute ``c`` of the module ``a.b``."""
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_every_public_op_has_one_row():
    assert set(OPS) == set(kda.__all__) - {"__version__"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_row_names_what_exists(name):
    op = OPS[name]
    assert callable(getattr(importlib.import_module(f"kda.{op.module}"), name))
    assert callable(importlib.import_module(f"kda.reference.{op.reference}").recurrent)
    assert callable(resolve(op.cpu_path))
    for test in op.tests:
        assert name in (ROOT / test).read_text(encoding="utf-8"), f"{test} does not call {name}"
    for language in ("zh", "en"):
        assert name in (ROOT / "docs" / language / f"{op.chapter}.md").read_text(encoding="utf-8")


@pytest.mark.tilelang
@pytest.mark.parametrize("name", sorted(OPS))
def test_a_rows_kernels_and_launchers_exist(name):
    pytest.importorskip("tilelang")
    op = OPS[name]
    for module, factory, params in op.kernels:
        assert callable(getattr(importlib.import_module(f"kda.kernels.{module}"), factory)), (module, factory)
    for launcher in op.launchers:
        assert callable(resolve(launcher)), launcher


def launched(call, monkeypatch):
    """The kernels ``call()`` launches with CUDA faked (every compile a stand-in that records the factory)."""
    from kda import gated_delta, validate
    from kda.kernels import build

    names = []

    def compile_program(program_fn, out_idx, target=None, pass_configs=None, **params):
        return lambda *args: names.append(program_fn.__name__)

    monkeypatch.setattr(build, "compile_program", compile_program)
    monkeypatch.setattr(build, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(validate, "runs_kernels", lambda x: True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)       # its path at any size
    for scalar_path in (False, True):
        monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", scalar_path)
        call()
    return set(names)


@pytest.mark.tilelang
@pytest.mark.parametrize("name", sorted(OPS))
def test_a_rows_kernels_are_what_its_cuda_path_launches(name, monkeypatch):
    """Each op on CPU tensors as on CUDA, every form of its inputs (a gate per head and per channel; GDN with
    and without the scalar-gate path): the set of kernels launched is the set its row lists."""
    pytest.importorskip("tilelang")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 70, 2, 64, generator=gen).bfloat16() for _ in range(3))
    k = torch.nn.functional.normalize(k.float(), dim=-1).bfloat16()
    beta, g_head, g = torch.rand(2, 70, 2), -torch.rand(2, 70, 2), -torch.rand(2, 70, 2, 64)
    fn = getattr(kda, name)
    calls = {"linear_attention": [lambda: fn(q, k, v)],
             "decay_attention": [lambda: fn(q, k, v, 0.9)],
             "gated_attention": [lambda: fn(q, k, v, g_head, check_values=False),
                                 lambda: fn(q, k, v, g, check_values=False)],
             "delta_rule": [lambda: fn(q, k, v, beta, check_values=False)],
             "chunk_kda": [lambda: fn(q, k, v, g, beta, check_values=False)],
             "chunk_gated_delta_rule": [lambda: fn(q, k, v, g_head, beta, check_values=False)],
             "fused_recurrent_kda": [lambda: fn(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1])],
             "fused_recurrent_gated_delta_rule": [lambda: fn(q[:, :1], k[:, :1], v[:, :1], g_head[:, :1],
                                                             beta=beta[:, :1])]}[name]
    seen = set()
    for call in calls:
        seen |= launched(call, monkeypatch)
    assert seen == {factory for _, factory, _ in OPS[name].kernels}
