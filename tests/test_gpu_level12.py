"""Levels 1-2 kernels on the GPU against the float64 references (marked ``gpu``)."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level1 as ref1
from kda.reference import level2 as ref2

import random_inputs

pytestmark = pytest.mark.gpu

TOL = {torch.float16: 1e-3, torch.bfloat16: 5e-3}
# (B, T, H, DK, DV): tails (T not a multiple of 64), a single token, DK != DV
SHAPES = [(2, 200, 3, 64, 128), (1, 64, 2, 128, 64), (3, 1, 2, 64, 64), (1, 1000, 4, 128, 128),
          (2, 129, 1, 128, 128), (1, 4096, 2, 64, 64)]


def inputs(shape, dtype, seed):
    B, T, H, DK, DV = shape
    q, k, v, _, _, h0 = random_inputs.gated_delta(B, T, H, DK, DV, gate="none", delta=False, normalize_keys=False,
                                                  dtype=torch.float32, cast=dtype, device="cuda", seed=seed)[:6]
    return q, k, v, h0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_attention_kernel(shape, dtype, poisoned):
    q, k, v, _ = inputs(shape, dtype, seed=zlib.crc32(repr(shape).encode()))
    scale = shape[3] ** -0.5
    o = kda.linear_attention(q, k, v)
    ref, _ = ref1.chunked(q.double() * scale, k, v)
    err = rel_l2(o, ref)
    assert err <= TOL[dtype], f"rel L2 {err:.2e} for {shape} {dtype}"
    assert torch.equal(o, kda.linear_attention(q, k, v)), "two runs differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [1.0, 0.99, 0.9, 0.5, "per_head"])
def test_decay_attention_kernel(shape, dtype, alpha, poisoned):
    q, k, v, _ = inputs(shape, dtype, seed=zlib.crc32(repr((shape, alpha)).encode()))
    if alpha == "per_head":
        alpha = torch.linspace(0.3, 1.0, shape[2])
    scale = shape[3] ** -0.5
    o = kda.decay_attention(q, k, v, alpha)
    ref, _ = ref2.chunked(q.double() * scale, k, v, alpha)
    err = rel_l2(o, ref)
    assert err <= TOL[dtype], f"rel L2 {err:.2e} for {shape} {dtype} alpha={alpha}"
    assert torch.equal(o, kda.decay_attention(q, k, v, alpha)), "two runs differ"


@pytest.mark.parametrize("level,variant", [(1, {}), (1, dict(overlap_gemms=False)), (2, {}),
                                           (2, dict(overlap_gemms=False)), (2, dict(weight_tables=True))], ids=str)
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 1000, 4, 128, 128)])
def test_pipelined_kernels(level, variant, shape):
    """The chapters' own kernels of levels 1 and 2 (``linear_attention`` and ``decay_attention`` run
    level 3's scalar pass, without a gate and with a constant decay) in each form the chapters time,
    states in and out, outputs poisoned."""
    from kda.kernels.chapters import constant_decay, linear_attention
    from kda.kernels.build import compile_program

    B, T, H, DK, DV = shape
    q, k, v, h0 = inputs(shape, torch.bfloat16, seed=zlib.crc32(repr((level, shape, variant)).encode()))
    alpha = torch.linspace(0.3, 1.0, H, dtype=torch.float64)
    kernel = compile_program((linear_attention if level == 1 else constant_decay).seq_in_loop, (), DK=DK, DV=DV, dtype="bfloat16",
                             initial_state=True, final_state=True, **variant)
    decays = () if level == 1 else (torch.log2(alpha).float().cuda(),)
    o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
    kernel(q, k, v, *decays, DK ** -0.5, h0, o, ht)
    if level == 1:
        ref_o, ref_ht = ref1.chunked(q.double() * DK ** -0.5, k, v, 64, h0.double(), True)
    else:
        ref_o, ref_ht = ref2.chunked(q.double() * DK ** -0.5, k, v, alpha, 64, h0.double(), True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= TOL[torch.bfloat16] and rel_l2(ht, ref_ht) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 130, 2, 128, 64)])
def test_states_in_and_out(level, shape, poisoned):
    """initial_state and output_final_state, tails included (the tail decays by a^L, not a^C)."""
    dtype = torch.bfloat16
    q, k, v, h0 = inputs(shape, dtype, seed=7)
    if level == 1:
        o, ht = kda.linear_attention(q, k, v, scale=1.0, initial_state=h0, output_final_state=True)
        ref, ref_ht = ref1.recurrent(q, k, v, h0, True)
    else:
        o, ht = kda.decay_attention(q, k, v, 0.95, scale=1.0, initial_state=h0, output_final_state=True)
        ref, ref_ht = ref2.recurrent(q, k, v, 0.95, h0, True)
    assert rel_l2(o, ref) <= TOL[dtype]
    assert rel_l2(ht, ref_ht) <= TOL[dtype]
    # final state alone (no initial state) also works
    fn = kda.linear_attention if level == 1 else (lambda *a, **kw: kda.decay_attention(*a[:3], 0.95, **kw))
    _, ht0 = fn(q, k, v, scale=1.0, output_final_state=True)
    ref_ht0 = (ref1.recurrent(q, k, v, None, True) if level == 1 else ref2.recurrent(q, k, v, 0.95, None, True))[1]
    assert rel_l2(ht0, ref_ht0) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 64 * 9 + 5, 2, 128, 128)])
def test_seq_in_grid_kernel(shape, dtype):
    """The teaching kernel computes the same function (output poisoned before the launch)."""
    from kda.kernels.chapters.linear_attention import seq_in_grid
    from kda.kernels.build import compile_program

    B, T, H, DK, DV = shape
    q, k, v, _ = inputs(shape, dtype, seed=3)
    kernel = compile_program(seq_in_grid, out_idx=(), DK=DK, DV=DV,
                             dtype={torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype])
    o = torch.full((B, T, H, DV), float("nan"), dtype=dtype, device="cuda")
    kernel(q, k, v, o)
    err = rel_l2(o, ref1.seq_in_grid(q, k, v)[0])
    assert err <= TOL[dtype], f"rel L2 {err:.2e}"


def test_extreme_alpha_no_nan(poisoned):
    """A decay so strong that a^(C-1) underflows: weights go to zero, never inf * 0."""
    q, k, v, _ = inputs((1, 300, 2, 64, 64), torch.bfloat16, seed=5)
    o = kda.decay_attention(q, k, v, torch.tensor([1e-30, 1e-3]))
    assert torch.isfinite(o).all()
    ref, _ = ref2.chunked(q.double() * 64 ** -0.5, k, v, torch.tensor([1e-30, 1e-3]))
    assert rel_l2(o, ref) <= TOL[torch.bfloat16]


def test_cuda_rejects_what_the_kernels_do_not_support():
    q, k, v, _ = inputs((1, 10, 1, 64, 64), torch.float16, seed=1)
    with pytest.raises(ValueError, match=r"DK \(last dim of q, k\) must be one of \(64, 128\)"):
        kda.linear_attention(q[..., :32], k[..., :32], v)
    with pytest.raises(ValueError, match=r"DV \(last dim of v\) must be one of \(64, 128\)"):
        kda.linear_attention(q, k, v[..., :48])
    with pytest.raises(ValueError, match="float16 or bfloat16 on CUDA"):
        kda.linear_attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="device of q"):
        kda.linear_attention(q, k.cpu(), v)
