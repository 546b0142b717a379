"""Every float64 reference agrees with the token recurrence; the structural mistakes do not."""

import math

import pytest
import torch

from kda.metrics import rel_l2
from kda.reference import level1 as ref1
from kda.reference import level2 as ref2

EPS = 1e-12   # float64 agreement (observed ~1e-16; the margin covers long sums)
# (B, T, H, DK, DV, chunk, block_dv): tails, a single token, T shorter than a chunk, DK != DV
SHAPES = [(2, 37, 3, 8, 12, 8, 4), (1, 1, 2, 4, 4, 4, 4), (2, 64, 1, 16, 8, 16, 8), (1, 50, 2, 6, 10, 64, 3),
          (3, 33, 2, 5, 7, 4, 7)]


def inputs(B, T, H, DK, DV, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, DK, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, DV, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, H, DK, DV, generator=g, dtype=torch.float64)
    return q, k, v, h0


@pytest.mark.parametrize("shape", SHAPES)
def test_level1_forms_agree(shape):
    B, T, H, DK, DV, C, bdv = shape
    q, k, v, h0 = inputs(B, T, H, DK, DV)
    o_a, s_a = ref1.recurrent(q, k, v, h0, True)
    for o, s in [ref1.chunked(q, k, v, C, h0, True), ref1.seq_in_grid(q, k, v, C, h0, True),
                 ref1.seq_in_loop(q, k, v, C, bdv, h0, True)]:
        assert rel_l2(o, o_a) < EPS and rel_l2(s, s_a) < EPS


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [0.9, 1.0, 0.3, "per_head"])
def test_level2_forms_agree(shape, alpha):
    B, T, H, DK, DV, C, bdv = shape
    q, k, v, h0 = inputs(B, T, H, DK, DV, seed=1)
    if alpha == "per_head":
        alpha = torch.linspace(0.2, 1.0, H, dtype=torch.float64)
    o_a, s_a = ref2.recurrent(q, k, v, alpha, h0, True)
    for o, s in [ref2.chunked(q, k, v, alpha, C, h0, True), ref2.chunked(q, k, v, alpha, C, h0, True, "factorized"),
                 ref2.seq_in_grid(q, k, v, alpha, C, h0, True), ref2.seq_in_loop(q, k, v, alpha, C, bdv, h0, True)]:
        assert rel_l2(o, o_a) < EPS and rel_l2(s, s_a) < EPS


def test_tail_state_decays_by_real_length():
    """The last chunk is shorter: carrying a^C instead of a^L would show in the final state."""
    q, k, v, h0 = inputs(1, 70, 1, 4, 4)
    _, s_a = ref2.recurrent(q, k, v, 0.8, h0, True)
    _, s_b = ref2.chunked(q, k, v, 0.8, 64, h0, True)
    assert rel_l2(s_b, s_a) < EPS


def test_alpha_one_is_level1():
    q, k, v, h0 = inputs(2, 45, 2, 6, 5)
    assert rel_l2(ref2.chunked(q, k, v, 1.0, 16, h0)[0], ref1.recurrent(q, k, v, h0)[0]) < EPS


def test_per_token_matrix_form():
    q, k, v, _ = inputs(2, 40, 3, 5, 6)
    alpha_t = 0.85 + 0.149 * torch.rand(2, 40, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    o, gamma = ref2.parallel_form(q, k, v, alpha_t)
    assert rel_l2(o, ref2.recurrent(q, k, v, alpha_t)[0]) < EPS
    assert gamma.max() <= 1.0 and torch.equal(gamma, gamma.tril())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_structural_mistakes_are_large(seed):
    q, k, v, _ = inputs(2, 128, 2, 16, 16, seed)
    a = ref1.recurrent(q, k, v)[0]
    assert rel_l2(ref1.chunked(q, k, v, 16, shift=False)[0], a) > 0.1
    assert rel_l2(ref1.seq_in_loop(q, k, v, 16, 8, update_first=True)[0], a) > 0.1


def test_bad_intra_form():
    q, k, v, _ = inputs(1, 4, 1, 2, 2)
    with pytest.raises(ValueError, match="intra"):
        ref2.chunked(q, k, v, 0.5, 4, intra="ratios")


# --- level 0: the gated delta rule, its WY form and the chunk affine map ----------------------

from kda.reference import level0 as ref0  # noqa: E402
from kda.reference import scalar_gate as ref_scalar  # noqa: E402


def delta_inputs(B, T, H, DK, DV, scalar_gate=False, strength=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, v = (torch.randn(B, T, H, d, generator=g, dtype=torch.float64) for d in (DK, DV))
    k = torch.nn.functional.normalize(torch.randn(B, T, H, DK, generator=g, dtype=torch.float64), dim=-1)
    gate_shape = (B, T, H) if scalar_gate else (B, T, H, DK)
    gate = -strength * torch.rand(*gate_shape, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, H, DK, DV, generator=g, dtype=torch.float64)
    return q, k, v, gate, beta, h0


def test_forward_substitution_matches_solve_triangular():
    g = torch.Generator().manual_seed(3)
    L = torch.eye(32, dtype=torch.float64) + torch.randn(5, 32, 32, generator=g, dtype=torch.float64).tril(-1) / 6
    B = torch.randn(5, 32, 7, generator=g, dtype=torch.float64)
    expected = torch.linalg.solve_triangular(L, B, upper=False, unitriangular=True)
    assert rel_l2(ref0.forward_substitution(L, B), expected) < EPS


@pytest.mark.parametrize("scalar_gate", [False, True], ids=["kda", "gdn"])
@pytest.mark.parametrize("T,C", [(70, 16), (16, 16), (5, 64), (130, 64)])
def test_gated_delta_chunked_matches_recurrence(scalar_gate, T, C):
    q, k, v, gate, beta, h0 = delta_inputs(2, T, 3, 8, 6, scalar_gate)
    o_a, s_a = ref0.recurrent(q, k, v, gate, beta, h0, True)
    o_b, s_b = ref0.chunked(q, k, v, gate, beta, C, h0, True)
    assert rel_l2(o_b, o_a) < EPS and rel_l2(s_b, s_a) < EPS


@pytest.mark.parametrize("gates", ["logsigmoid", "runs_of_-20", "zero"])
@pytest.mark.parametrize("T", [1, 64, 130])
def test_scalar_gate_chunked_matches_recurrence(gates, T):
    """GDN by the gated inverse alone (``kda.kernels.scalar_gate``'s arithmetic) is the recurrence:
    tails, an initial state, runs of -20 (a decay of e^-880 over one chunk) and no decay at all."""
    gen = torch.Generator().manual_seed(T)
    B, H, DK, DV = 2, 3, 8, 12
    q, v = torch.randn(B, T, H, DK, generator=gen), torch.randn(B, T, H, DV, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, DK, generator=gen), dim=-1)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen))
    if gates == "runs_of_-20":
        g[:, 20:90] = -20.0
    elif gates == "zero":
        g = torch.zeros_like(g)
    beta, h0 = torch.rand(B, T, H, generator=gen), torch.randn(B, H, DK, DV, generator=gen)
    o, S = ref_scalar.scalar_gate_chunked(q, k, v, g, beta, 64, h0, True)
    ref_o, ref_S = ref0.recurrent(q, k, v, g, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert rel_l2(o, ref_o) < 1e-12 and rel_l2(S, ref_S) < 1e-12


@pytest.mark.parametrize("form", ["in_order", "best_fit"])
@pytest.mark.parametrize("gates", ["logsigmoid", "runs_of_-20"])
def test_packed_tiles_match_recurrence(gates, form):
    """Short packed sequences without states, tile by tile as ``packed_tile_output`` computes them (``G`` over the
    whole tile, the pairs of two sequences masked), over ``packed.sequence_tiles``' tiles in order and over
    ``packed.sequence_rows``' best fit through its row map, are the recurrence sequence by sequence: empty sequences,
    single tokens, a full chunk, grouped value heads."""
    from kda import packed

    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(0, 65, (40,), generator=gen).tolist() + [1, 0, 64, 1]
    bounds = (0, *torch.tensor(lengths).cumsum(0).tolist())
    T, HQ, H, DK, DV = bounds[-1], 2, 4, 8, 6
    q, k = (torch.nn.functional.normalize(torch.randn(1, T, HQ, DK, generator=gen), dim=-1) for _ in range(2))
    v, beta = torch.randn(1, T, H, DV, generator=gen), torch.rand(1, T, H, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, generator=gen))
    if gates == "runs_of_-20":
        g[:, ::3] = -20.0
    if form == "in_order":
        (tiles, starts), rows = packed.sequence_tiles(bounds, "cpu"), None
    else:
        tiles, rows, starts = packed.sequence_rows(bounds, "cpu")
    o = ref_scalar.packed_tiles(q, k, v, g, beta, tiles, starts, rows)
    qh, kh = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e > s:
            ref_o, _ = ref0.recurrent(*(x[:, s:e] for x in (qh, kh, v, g, beta)))
            assert rel_l2(o[:, s:e], ref_o) < 1e-12, (s, e)
    assert torch.isfinite(o).all()


def test_chunk_affine_map_and_composition():
    q, k, v, gate, beta, h0 = delta_inputs(1, 40, 2, 8, 4, strength=2.0)
    per_chunk = lambda s: [x[:, s].transpose(1, 2) for x in (k, v, gate)] + [beta[:, s].transpose(1, 2)]
    first = ref0.chunk_affine(*per_chunk(slice(0, 20)))
    second = ref0.chunk_affine(*per_chunk(slice(20, 40)))
    M, B = ref0.compose(first, second)
    _, s_ref = ref0.recurrent(q, k, v, gate, beta, h0, True)
    assert rel_l2(M @ h0 + B, s_ref) < EPS


# --- level 3: per-token gates, scalar and per channel ---------------------------------------

from kda.reference import level3 as ref3  # noqa: E402


def gated_inputs(B, T, H, DK, DV, scalar, strength, seed=0):
    q, k, v, _ = inputs(B, T, H, DK, DV, seed)
    g = torch.Generator().manual_seed(seed + 10)
    shape = (B, T, H) if scalar else (B, T, H, DK)
    gate = -strength * torch.rand(*shape, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, H, DK, DV, generator=g, dtype=torch.float64)
    return q, k, v, gate, h0


@pytest.mark.parametrize("scalar", [True, False], ids=["scalar", "per_channel"])
@pytest.mark.parametrize("strength", [0.01, 1.0, 20.0])
@pytest.mark.parametrize("shape", [(2, 37, 3, 8, 12, 16, 4), (1, 70, 2, 6, 10, 64, 3), (1, 1, 1, 4, 4, 16, 4)])
def test_level3_forms_agree(scalar, strength, shape):
    """Mild to extreme gates (down to -20 per step): every form agrees, nothing overflows."""
    B, T, H, DK, DV, C, bdv = shape
    q, k, v, gate, h0 = gated_inputs(B, T, H, DK, DV, scalar, strength)
    o_a, s_a = ref3.recurrent(q, k, v, gate, h0, True)
    for o, s in [ref3.chunked(q, k, v, gate, C, h0, True), ref3.seq_in_grid(q, k, v, gate, C, h0, True),
                 ref3.seq_in_loop(q, k, v, gate, C, bdv, h0, True, subchunk=4)]:
        assert torch.isfinite(o).all() and torch.isfinite(s).all()
        assert rel_l2(o, o_a) < EPS and rel_l2(s, s_a) < EPS


def test_level3_constant_gate_is_level2():
    q, k, v, _ = inputs(2, 50, 2, 6, 5)
    gate = torch.full((2, 50, 2), torch.log(torch.tensor(0.9, dtype=torch.float64)).item(), dtype=torch.float64)
    assert rel_l2(ref3.chunked(q, k, v, gate, 16)[0], ref2.recurrent(q, k, v, 0.9)[0]) < EPS


@pytest.mark.parametrize("C,sub", [(64, 16), (32, 8), (16, 16)])
def test_subchunk_scores_match_pairwise_without_overflow(C, sub):
    g = torch.Generator().manual_seed(5)
    Qc, Kc = (torch.randn(2, C, 8, generator=g, dtype=torch.float64) for _ in range(2))
    G = torch.cumsum(-20 * torch.rand(2, C, 8, generator=g, dtype=torch.float64), dim=-2)   # strong gates
    got = ref3.intra_by_subchunks(Qc, Kc, G, sub)
    want = ref3.pairwise_scores(Qc, Kc, G)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()


@pytest.mark.parametrize("scalar", [True, False], ids=["scalar", "per_channel"])
@pytest.mark.parametrize("strength", [0.01, 1.0, 20.0])
@pytest.mark.parametrize("T", [1, 64, 70, 200])
def test_level3_kernel_mimic_matches_recurrence(scalar, strength, T):
    """The two-stage form the kernels compute (prepare in log2 units, then the pass), tails included."""
    q, k, v, gate, h0 = gated_inputs(2, T, 2, 16, 8, scalar, strength)
    o_a, s_a = ref3.recurrent(q * 0.5, k, v, gate, h0, True)
    o, s = ref3.kernel_mimic(q, k, v, gate, 0.5, 64, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert rel_l2(o, o_a) < EPS and rel_l2(s, s_a) < EPS


def test_level3_prepare_weights_never_exceed_one():
    """Qw / scale, Kw and the chunk decay are the inputs times factors in (0, 1]; padding rows are zero."""
    q, k, _, gate, _ = gated_inputs(1, 100, 2, 8, 4, False, 20.0)
    Qw, Kw, decay, _ = ref3.prepare(q, k, gate, 1.0)
    Qc, Kc = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, 28)).permute(0, 2, 1, 3).reshape(1, 2, 2, 64, 8)
              for x in (q, k))
    assert (Qw.abs() <= Qc.abs()).all() and (Kw.abs() <= Kc.abs()).all()
    assert (decay <= 1).all() and (decay >= 0).all()
    assert (Kw[:, :, 1, 36:] == 0).all()          # the tail chunk has 36 real rows


# --- level 4: the delta rule (WY / UT form) ---------------------------------------------------

from kda.reference import level4 as ref4  # noqa: E402
from kda.reference.common import to_chunks  # noqa: E402


def delta_rule_inputs(B, T, H, DK, DV, seed=0, normalize=True):
    q, k, v, _ = inputs(B, T, H, DK, DV, seed)
    g = torch.Generator().manual_seed(seed + 20)
    if normalize:
        k = ref4.l2_normalize(k)
    beta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, H, DK, DV, generator=g, dtype=torch.float64)
    return q, k, v, beta, h0


@pytest.mark.parametrize("T,C", [(1, 16), (37, 16), (64, 64), (130, 64), (200, 32)])
def test_level4_forms_agree(T, C):
    q, k, v, beta, h0 = delta_rule_inputs(2, T, 3, 16, 8)
    o_a, s_a = ref4.recurrent(q, k, v, beta, h0, True)
    for o, s in [ref4.chunked(q, k, v, beta, C, h0, True), ref4.kernel_mimic(q, k, v, beta, 1.0, C, h0, True)]:
        assert rel_l2(o, o_a) < EPS and rel_l2(s, s_a) < EPS


def test_level4_is_level0_without_gate():
    """The gated delta rule of level 0 with g = 0 is this level's delta rule."""
    q, k, v, beta, h0 = delta_rule_inputs(1, 70, 2, 8, 6)
    o0, s0 = ref0.recurrent(q, k, v, torch.zeros(1, 70, 2), beta, h0, True)
    o4, s4 = ref4.recurrent(q, k, v, beta, h0, True)
    assert rel_l2(o4, o0) < EPS and rel_l2(s4, s0) < EPS


@pytest.mark.parametrize("normalize", [True, False])
def test_blocked_inverse_matches_solve_triangular(normalize):
    q, k, v, beta, _ = delta_rule_inputs(2, 128, 2, 32, 8, seed=3, normalize=normalize)
    Kc = to_chunks(k, 64)
    bc = to_chunks(beta[..., None], 64)[..., 0]
    A = ref4.scaled_kkt(Kc, bc)
    eye = torch.eye(64, dtype=torch.float64)
    want = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
    for got in (ref4.invert_unit_lower(A), ref4.invert_unit_lower_blocked(A, 16),
                ref4.invert_unit_lower_products(A, 16)):
        assert rel_l2(got, want) < 1e-12


def test_level4_beta_zero_keeps_the_state_and_beta_one_writes_v():
    """b = 0: nothing is written. b = 1 with a unit key: S^T k equals v right after the step."""
    q, k, v, _, h0 = delta_rule_inputs(1, 5, 1, 8, 4)
    _, s = ref4.recurrent(q, k, v, torch.zeros(1, 5, 1), h0, True)
    assert torch.equal(s, h0)
    _, s = ref4.recurrent(q[:, :1], k[:, :1], v[:, :1], torch.ones(1, 1, 1), h0, True)
    assert torch.allclose(torch.einsum("bhk,bhkv->bhv", k[:, 0], s), v[:, 0], atol=1e-12)


from kda.reference import level5 as ref5  # noqa: E402


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("T,gate", [(1, 1.0), (70, 1.0), (200, 5.0), (130, 20.0)])
def test_level5_kernel_mimic_matches_the_token_recurrence(T, gate, per_channel):
    """The stages of kda.kernels.chunk_intra and gated_state_pass in float64 (prepare twice, blocked solve, fused pass)
    against level 0's token recurrence, gates down to -20 per step, tails included."""
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen)
    k = ref4.l2_normalize(torch.randn(2, T, 3, 16, dtype=torch.float64, generator=gen))
    v = torch.randn(2, T, 3, 8, dtype=torch.float64, generator=gen)
    g = -gate * torch.rand(2, T, 3, *((16,) if per_channel else ()), dtype=torch.float64, generator=gen)
    beta = torch.rand(2, T, 3, dtype=torch.float64, generator=gen)
    h0 = torch.randn(2, 3, 16, 8, dtype=torch.float64, generator=gen)
    o, s = ref0.recurrent(q * 0.3, k, v, g, beta, h0, True)
    o5, s5 = ref5.kernel_mimic(q, k, v, g, beta, 0.3, 64, h0, True)
    assert rel_l2(o5, o) < 1e-13 and rel_l2(s5, s) < 1e-13


def test_capped_diagonal_is_exact_until_a_step_is_capped_and_within_its_bound_after():
    """``kda.reference.level3.capped_diagonal`` (the steep chunks' diagonal blocks of ``pairwise="capped"``): where no
    token falls by more than the cap it gives the pairwise sums; where some do, every score moves by at most
    ``2^-cap ||x_i|| ||k_j||``, and the pairs that cross no capped step do not move."""
    from kda.kernels.chunk_intra import step_cap
    from kda.reference.level3 import capped_diagonal, pairwise_scores

    gen = torch.Generator().manual_seed(3)
    C, D, cap = 64, 32, step_cap(16)
    X, K = torch.randn(2, C, D, generator=gen, dtype=torch.float64), torch.randn(2, C, D, generator=gen,
                                                                                  dtype=torch.float64)
    blocks = torch.block_diag(*[torch.ones(16, 16, dtype=torch.bool)] * (C // 16))
    for fall, capped_any in ((cap - 0.5, False), (4 * cap, True)):
        steps = -fall * torch.rand(2, C, D, generator=gen, dtype=torch.float64)
        G = torch.cumsum(steps, dim=-2)
        exact = torch.where(blocks, pairwise_scores(X, K, G * math.log(2)), 0.0)
        got = capped_diagonal(X, K, G, cap)
        bound = 2.0 ** -cap * X.norm(dim=-1)[..., :, None] * K.norm(dim=-1)[..., None, :]
        assert ((got - exact).abs() <= bound + 1e-12 * exact.abs()).all()
        crossed = torch.cumsum((steps < -cap).double(), dim=-2)          # capped steps up to each row
        clean = blocks & torch.tril(torch.ones(C, C, dtype=torch.bool)) & \
            (crossed[..., :, None, :] == crossed[..., None, :, :]).all(-1)
        assert torch.allclose(got[clean], exact[clean], rtol=1e-10, atol=1e-12)
        assert (not torch.allclose(got, exact, rtol=1e-8, atol=1e-12)) == capped_any


def test_stream_chunk_marks():
    """Per chunk of the packed stream: the rows that continue a sequence begun before it, and the first row of its
    last sequence (0 where that one began at or before the chunk's start); empty sequences start nowhere."""
    from kda.reference.packed_stream import stream_chunk_marks

    # chunks of 8 over [0, 5), an empty one, [5, 12) across the first boundary, [12, 20), [20, 24), then [24, 26)
    # starting on the last chunk's first row
    marks = stream_chunk_marks((0, 5, 5, 12, 20, 24, 26), chunk_size=8)
    assert marks.tolist() == [[0, 5], [4, 4], [4, 4], [0, 0]]
    assert stream_chunk_marks((0, 20), chunk_size=8).tolist() == [[0, 0], [8, 0], [4, 0]]


@pytest.mark.parametrize("gate", ["per_channel", "scalar", "runs_of_-20"])
def test_packed_stream_matches_recurrence(gate):
    """The packed sequences cut into chunks as one stream, the state reset where a sequence starts
    (``kda.reference.packed_stream``), is the recurrence sequence by sequence from zero states: sequences within a
    chunk, across chunks and longer than several, starting on a chunk's first row, single tokens, empty ones."""
    from kda.reference.packed_stream import stream_chunked

    gen = torch.Generator().manual_seed(11)
    lengths = [3, 0, 1, 16, 13, 40, 1, 1, 0, 7, 9, 2, 30] + torch.randint(0, 20, (12,), generator=gen).tolist()
    bounds = (0, *torch.tensor(lengths).cumsum(0).tolist())
    T, H, DK, DV = bounds[-1], 2, 6, 5
    q = torch.randn(1, T, H, DK, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, DK, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, H, DV, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, T, H, generator=gen, dtype=torch.float64)
    shape = (1, T, H, DK) if gate == "per_channel" else (1, T, H)
    g = torch.nn.functional.logsigmoid(torch.randn(*shape, generator=gen, dtype=torch.float64))
    if gate == "runs_of_-20":
        g[:, 30:60] = -20.0
    o = stream_chunked(q, k, v, g, beta, bounds, chunk_size=8)
    assert torch.isfinite(o).all()
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e > s:
            ref_o, _ = ref0.recurrent(*(x[:, s:e] for x in (q, k, v, g, beta)))
            assert rel_l2(o[:, s:e], ref_o) < 1e-12, (s, e)
