"""Level-4 kernels on the GPU against the float64 references (marked ``gpu``)."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level4 as ref4
from kda.reference.common import from_chunks, to_chunks

import random_inputs

pytestmark = pytest.mark.gpu


TOL = {torch.float16: 5e-3, torch.bfloat16: 5e-3}
SHAPES = [(2, 200, 3, 64, 128), (1, 1, 2, 64, 64), (1, 1000, 2, 128, 64), (1, 129, 2, 128, 128)]


def inputs(shape, dtype, seed, beta_range=(0.0, 1.0)):
    B, T, H, DK, DV = shape
    q, k, v, _, beta, h0 = random_inputs.gated_delta(B, T, H, DK, DV, gate="none", beta_range=beta_range,
                                                     dtype=torch.float32, cast=dtype, device="cuda", seed=seed)[:6]
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


def nan_like(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def kernel(name, **params):
    from kda.kernels import linear_pass, wy_solve
    from kda.kernels.build import compile_program
    from kda.kernels.chapters import delta_split

    module = next(m for m in (wy_solve, linear_pass, delta_split) if hasattr(m, name))
    return compile_program(getattr(module, name), (), chunk_size=64, **params)


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan")])
def test_beta_out_of_range_raises(value):
    """chunk_wy checks beta as it reads it; delta_rule raises the full check's error, also for one
    bad value in the tail chunk; without the check it computes, and a good input passes."""
    q, k, v, beta, _ = inputs((1, 200, 2, 64, 64), torch.bfloat16, seed=3)
    beta[0, 190, 1] = value
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        kda.delta_rule(q, k, v, beta)
    kda.delta_rule(q, k, v, beta, check_values=False)      # no read-back, no error
    beta[0, 190, 1] = 0.5
    kda.delta_rule(q, k, v, beta)


STAGE_SHAPES = [(2, 200, 3, 64, 128), (1, 1000, 2, 128, 64)]


@pytest.mark.parametrize("merge", ["products", "substitution"])
@pytest.mark.parametrize("shape", STAGE_SHAPES)
def test_wy_stage_and_solve(shape, merge):
    """chunk_wy alone: the inverse against torch.linalg.solve_triangular in float64 (rows of the
    sequence only: the tail chunk's padding rows are not written), W and U against the reference."""
    B, T, H, DK, DV = shape
    _, k, v, beta, _ = inputs(shape, torch.bfloat16, seed=5)
    W, U, Ainv = nan_like((B, T, H, DK), k.dtype), nan_like((B, T, H, DV), k.dtype), nan_like((B, T, H, 64))
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    kernel("chunk_wy", DK=DK, DV=DV, dtype="bfloat16", merge=merge, write_inverse=True)(k, v, beta, W, U, Ainv, flags)
    assert flags.tolist() == [0, 0], "beta in [0, 1] flagged"
    Kc, Vc = to_chunks(k.double(), 64), to_chunks(v.double(), 64)
    bc = to_chunks(beta.double()[..., None], 64)[..., 0]
    A = ref4.scaled_kkt(Kc, bc)
    eye = torch.eye(64, dtype=torch.float64, device="cuda")
    exact = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
    # float32 substitution: rounding only; tf32 products: 11 significant bits in the GEMMs
    bound = 1e-5 if merge == "substitution" else 1e-3
    assert rel_l2(Ainv, from_chunks(exact, T)) <= bound
    W_ref, U_ref = ref4.wy(exact, Kc, Vc, bc)
    assert rel_l2(W, from_chunks(W_ref, T)) <= 5e-3 and rel_l2(U, from_chunks(U_ref, T)) <= 5e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", STAGE_SHAPES)
def test_state_output_stages(shape, dtype):
    """state_pass, chunk_output and the fused state_output_pass alone, fed the same W and U,
    against kda.reference.level4.state_pass / chunk_output in float64."""
    B, T, H, DK, DV = shape
    q, k, v, beta, h0 = inputs(shape, dtype, seed=7)
    name = "float16" if dtype == torch.float16 else "bfloat16"
    W, U = torch.empty_like(k), torch.empty_like(v)
    kernel("chunk_wy", DK=DK, DV=DV, dtype=name)(k, v, beta, W, U, torch.empty(1, 1, 1, 1, device="cuda"),
                                                 torch.zeros(2, dtype=torch.int32, device="cuda"))
    Qc, Kc, Wc, Uc = (to_chunks(x.double(), 64) for x in (q * DK ** -0.5, k, W, U))
    snapshots, v_new, final = ref4.state_pass(Kc, Wc, Uc, h0.double())
    o_ref = from_chunks(ref4.chunk_output(Qc, Kc, snapshots, v_new), T)

    NC = -(-T // 64)
    h, vn, ht = nan_like((B, NC, H, DK, DV), dtype), nan_like((B, T, H, DV), dtype), nan_like((B, H, DK, DV))
    kernel("state_pass", DK=DK, DV=DV, dtype=name)(k, W, U, h0, h, vn, ht)
    assert rel_l2(h, snapshots.permute(0, 2, 1, 3, 4)) <= 5e-3
    assert rel_l2(vn, from_chunks(v_new, T)) <= 5e-3 and rel_l2(ht, final) <= 5e-3
    o = nan_like((B, T, H, DV), dtype)
    kernel("chunk_output", DK=DK, DV=DV, dtype=name)(q, k, h, vn, DK ** -0.5, o)
    assert rel_l2(o, o_ref) <= 5e-3

    o, ht = nan_like((B, T, H, DV), dtype), nan_like((B, H, DK, DV))
    kernel("state_output_pass", DK=DK, DV=DV, dtype=name, initial_state=True, final_state=True)(
        q, k, U, W, torch.empty(1, device="cuda"), DK ** -0.5, h0, o, ht)
    assert rel_l2(o, o_ref) <= 5e-3 and rel_l2(ht, final) <= 5e-3


@pytest.mark.parametrize("config", [dict(slots=2, out_groups=1), dict(slots=2, out_groups=2),
                                    dict(slots=3, out_groups=1)], ids=str)
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 64 * 5, 2, 128, 128), (1, 1000, 2, 128, 64)])
def test_state_output_pass_arrangements(shape, config):
    """The warp-specialised pass in other slot and output-group arrangements than the default: the
    same products in the same order, so bit-identical outputs and final states (tails included),
    and within tolerance of the float64 stages."""
    B, T, H, DK, DV = shape
    q, k, v, beta, h0 = inputs(shape, torch.bfloat16, seed=zlib.crc32(repr(shape).encode()))
    W, U = torch.empty_like(k), torch.empty_like(v)
    kernel("chunk_wy", DK=DK, DV=DV, dtype="bfloat16")(k, v, beta, W, U, torch.empty(1, 1, 1, 1, device="cuda"),
                                                       torch.zeros(2, dtype=torch.int32, device="cuda"))
    results = []
    for params in ({}, config):
        o, ht = nan_like((B, T, H, DV), torch.bfloat16), nan_like((B, H, DK, DV))
        kernel("state_output_pass", DK=DK, DV=DV, dtype="bfloat16", initial_state=True, final_state=True,
               **params)(q, k, U, W, torch.empty(1, device="cuda"), DK ** -0.5, h0, o, ht)
        results.append((o, ht))
    (o0, ht0), (o, ht) = results
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert torch.equal(o, o0) and torch.equal(ht, ht0)
    Qc, Kc, Wc, Uc = (to_chunks(x.double(), 64) for x in (q * DK ** -0.5, k, W, U))
    snapshots, v_new, final = ref4.state_pass(Kc, Wc, Uc, h0.double())
    assert rel_l2(o, from_chunks(ref4.chunk_output(Qc, Kc, snapshots, v_new), T)) <= 5e-3
    assert rel_l2(ht, final) <= 5e-3
