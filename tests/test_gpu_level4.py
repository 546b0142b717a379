"""Level-4 kernels on the GPU against the float64 references (marked ``gpu``)."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level4 as ref4
from kda.reference._common import from_chunks, to_chunks

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def kernels_under_test(monkeypatch):
    """These tests are the check that kda.delta.CUDA_KERNELS_CHECKED waits for."""
    import kda.delta

    monkeypatch.setattr(kda.delta, "CUDA_KERNELS_CHECKED", True)

TOL = {torch.float16: 5e-3, torch.bfloat16: 5e-3}
SHAPES = [(2, 200, 3, 64, 128), (1, 1, 2, 64, 64), (1, 1000, 2, 128, 64), (1, 129, 2, 128, 128)]


def inputs(shape, dtype, seed, beta_range=(0.0, 1.0)):
    B, T, H, DK, DV = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, DK, generator=gen, device="cuda").to(dtype)
    k = ref4.l2_normalize(torch.randn(B, T, H, DK, generator=gen, device="cuda")).to(dtype)
    v = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype)
    lo, hi = beta_range
    beta = lo + (hi - lo) * torch.rand(B, T, H, generator=gen, device="cuda")
    h0 = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    return q, k, v, beta, h0


@pytest.mark.parametrize("beta_range", [(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)], ids=["b0", "b01", "b1"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_delta_rule_kernels(shape, dtype, beta_range, poisoned):
    q, k, v, beta, h0 = inputs(shape, dtype, zlib.crc32(repr((shape, beta_range)).encode()), beta_range)
    DK = shape[3]
    o, ht = kda.delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_ht = ref4.recurrent(q.double() * DK ** -0.5, k, v, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= TOL[dtype], f"o: {rel_l2(o, ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= TOL[dtype], f"final state: {rel_l2(ht, ref_ht):.2e}"


@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 1000, 2, 128, 64)])
def test_wy_stage_and_solve(shape):
    """chunk_wy alone: the inverse against torch.linalg.solve_triangular in float64, W and U
    against the reference stages."""
    from kda.kernels import level4 as k4
    from kda.kernels.build import compile_program

    B, T, H, DK, DV = shape
    _, k, v, beta, _ = inputs(shape, torch.bfloat16, seed=5)
    W = torch.full((B, T, H, DK), float("nan"), dtype=k.dtype, device="cuda")
    U = torch.full((B, T, H, DV), float("nan"), dtype=k.dtype, device="cuda")
    Ainv = torch.full((B, T, H, 64), float("nan"), device="cuda")
    compile_program(k4.chunk_wy, (), DK=DK, DV=DV, chunk_size=64, dtype="bfloat16")(k, v, beta, W, U, Ainv)
    Kc, Vc = to_chunks(k.double(), 64), to_chunks(v.double(), 64)
    bc = to_chunks(beta.double()[..., None], 64)[..., 0]
    A = ref4.scaled_kkt(Kc, bc)
    eye = torch.eye(64, dtype=torch.float64, device="cuda")
    want = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
    got = to_chunks(Ainv.double(), 64)
    assert rel_l2(got, want) <= 1e-5
    W_ref, U_ref = ref4.wy(want, Kc, Vc, bc)
    assert rel_l2(W, from_chunks(W_ref, T)) <= 5e-3 and rel_l2(U, from_chunks(U_ref, T)) <= 5e-3
