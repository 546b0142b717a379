"""kda.backward, the backward that CUDA runs (float32 torch stages), checked on the CPU: the same
code in float64 equals autograd through the token recurrence to rounding, in float32 to ~1e-6; its
grouping of chunks, packed layout, grouped value heads and L2 norm; and the op's route to it."""

import contextlib
import functools
import inspect
import math

import pytest
import torch

import kda
from kda import backward, cuda_autograd, launch
from kda.metrics import rel_l2
from kda.reference import backward as ref
from kda.reference import level4 as ref4

import random_inputs

F64 = dict(dtype=torch.float64)


@pytest.fixture(autouse=True)
def torch_stages(monkeypatch):
    """Every test starts from the torch stages (the kernel switches off) and turns on what it checks;
    on CUDA the switches are on by default, and a faked CUDA would otherwise route to kernels."""
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL"):
        monkeypatch.setattr(backward, switch, False)


def inputs(B=2, T=70, H=2, K=8, V=5, seed=0, per_channel=True, strong=False, HQ=None):
    return random_inputs.gated_delta(B, T, H, K, V, HQ=HQ, gate="channel" if per_channel else "head", strong=strong,
                                     seed=seed)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "scalar"])
@pytest.mark.parametrize("strong", [False, True], ids=["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("dtype,budget,bound", [(torch.float64, None, 1e-12), (torch.float64, 1, 1e-12),
                                                (torch.float32, None, 2e-5)], ids=["f64", "f64_one_chunk", "f32"])
def test_chunked_gradients_are_the_recurrence_gradients(per_channel, strong, dtype, budget, bound):
    """T = 70 in chunks of 16 (four full chunks and a tail); ``budget=1`` makes every group one chunk."""
    q, k, v, g, beta, h0, do, dht = inputs(per_channel=per_channel, strong=strong)
    want = ref.recurrence_backward(q, k, v, g, beta, do, dht, 0.5, h0)
    got = backward.chunked_gradients(q, k, v, g, beta, do, dht, 0.5, h0, chunk_size=16, dtype=dtype, budget=budget)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        assert rel_l2(a, b) < bound, f"{name}: {rel_l2(a, b):.1e}"


@pytest.mark.parametrize("level", ["linear", "gated", "delta"])
def test_chunked_gradients_without_gate_or_delta_rule(level):
    """Levels 1-4 are the same stages with no gate (``g=None``) or no delta rule (``beta=None``)."""
    q, k, v, g, beta, h0, do, dht = inputs(T=37, seed=1)
    g = None if level in ("linear", "delta") else g
    beta = None if level in ("linear", "gated") else beta
    want = ref.recurrence_backward(q, k, v, g, beta, do, dht, 1.0, h0)
    got = backward.chunked_gradients(q, k, v, g, beta, do, dht, 1.0, h0, chunk_size=16, dtype=torch.float64)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert rel_l2(a, b) < 1e-12, f"{name}: {rel_l2(a, b):.1e}"


def test_chunk_groups_cover_every_chunk_within_the_budget():
    per_chunk = 1 * 4 * 64 * (16 * 128 * 8 + 256 * 16) * 4
    assert backward.chunk_groups(1, 4, 10, 64, 128, 128, 128, budget=3 * per_chunk) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert backward.chunk_groups(1, 4, 10, 64, 128, 128, 128, budget=1) == [(c, c + 1) for c in range(10)]
    assert backward.chunk_groups(1, 4, 0, 64, 128, 128, 128) == []
    assert len(backward.chunk_groups(1, 4, 10, 64, 128, 128, 1, budget=3 * per_chunk)) == 1   # a gate per head


def test_memory_budget_is_the_setting_or_a_share_of_free_memory(monkeypatch):
    """Unset: 2 GiB off CUDA; on CUDA a quarter of the free memory within [1, 16] GiB (the free memory
    faked here); set, the setting everywhere."""
    monkeypatch.setattr(backward, "MEMORY_BUDGET", None)
    assert backward.memory_budget("cpu") == 2 << 30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for free, want in [(100 << 30, 16 << 30), (12 << 30, 3 << 30), (1 << 30, 1 << 30)]:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 141 << 30))
        assert backward.memory_budget("cuda") == want
    monkeypatch.setattr(backward, "MEMORY_BUDGET", 5)
    assert backward.memory_budget("cuda") == backward.memory_budget("cpu") == 5


def test_packed_layout_starts_every_sequence_on_a_chunk():
    where, segments = backward.packed_layout([0, 3, 3, 20, 21], 16, "cpu")
    assert segments == [(0, 1), (1, 1), (1, 3), (3, 4)]
    assert where.tolist() == [0, 1, 2, *range(16, 33), 48]


def op_inputs(per_channel, T=75, HQ=2, H=2, seed=2, with_state=True):
    q, k, v, g, beta, h0, do, dht = inputs(B=1, T=T, H=H, HQ=HQ, K=8, V=6, seed=seed, per_channel=per_channel)
    return q * 3, k * 2, v, g, beta, h0, do, dht      # keys not unit: the L2 norm has work to do


def autograd_gradients(q, k, v, g, beta, h0, do, dht, cu_seqlens, l2norm):
    """The CPU path's gradients: autograd through kda's float64 forward."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
    h0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    fn = kda.chunk_kda if g.dim() == 4 else kda.chunk_gated_delta_rule
    # check_values=False: keys of norm 2 (op_inputs), past the delta rule's bound on purpose
    o, final = fn(*leaves, scale=0.4, initial_state=h0, output_final_state=dht is not None,
                  use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens, check_values=False)
    loss = (o * do).sum() + ((final * dht).sum() if dht is not None else 0)
    wanted = leaves + ([h0] if h0 is not None else [])
    return torch.autograd.grad(loss, wanted)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("case", ["dense", "packed", "grouped_heads", "l2norm", "no_state"])
def test_op_gradients_equal_the_cpu_path(per_channel, case):
    """``op_gradients`` (what the op's backward runs on CUDA) against autograd through the CPU path:
    packed sequences with an empty one, one of length 1 and lengths not a multiple of 64; grouped value
    heads; the L2 norm in the op; no initial state and no final state."""
    HQ, H = (1, 2) if case == "grouped_heads" else (2, 2)
    q, k, v, g, beta, h0, do, dht = op_inputs(per_channel, T=150, HQ=HQ, H=H)
    cu = torch.tensor([0, 70, 70, 71, 150]) if case == "packed" else None
    if case == "packed":
        gen = torch.Generator().manual_seed(5)
        h0, dht = (torch.randn(4, H, 8, 6, generator=gen, **F64) for _ in range(2))
    if case == "no_state":
        h0, dht = None, None
    l2norm = case == "l2norm"
    want = autograd_gradients(q, k, v, g, beta, h0, do, dht, cu, l2norm)
    got = backward.op_gradients(q, k, v, g, beta, 0.4, h0, l2norm, cu, do, dht)
    if cu is not None:                                   # the host copy of the boundaries: the same gradients
        same = backward.op_gradients(q, k, v, g, beta, 0.4, h0, l2norm, cu, do, dht, cu_seqlens_cpu=cu.clone())
        assert all(torch.equal(a, b) for a, b in zip(got, same))
    assert len(got) == len(want)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel_l2(a, b) < 2e-5, f"{name}: {rel_l2(a, b):.1e}"      # float32 stages against float64


def test_op_gradients_of_a_gate_per_head_with_a_unit_channel():
    """The kernels' scalar gate layout ``[B, T, H, 1]`` gets its gradient in that layout."""
    q, k, v, g, beta, h0, do, dht = op_inputs(False, T=40)
    full = backward.op_gradients(q, k, v, g, beta, 0.4, h0, False, None, do, dht)
    unit = backward.op_gradients(q, k, v, g[..., None], beta, 0.4, h0, False, None, do, dht)
    assert unit[3].shape == (*g.shape, 1) and torch.equal(unit[3][..., 0], full[3])


def test_the_op_backward_on_cuda_is_kda_backward(monkeypatch):
    """``kda::chunk_gated_delta_backward`` has a CUDA kernel, ``cuda_autograd.cuda_gradients`` (called here
    on CPU tensors): it refuses while the switch is off and otherwise gives the CPU kernel's gradients."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("kda::chunk_gated_delta_backward", "CUDA")
    q, k, v, g, beta, h0, do, dht = op_inputs(True, T=70)
    args = (q, k, v, g, beta, 0.4, h0, True, True, None, None, do, dht)
    on_cpu = torch.ops.kda.chunk_gated_delta_backward(*args)
    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", False)
    with pytest.raises(NotImplementedError, match="kda.cuda_autograd.DEVICE_BACKWARD = True"):
        cuda_autograd.cuda_gradients(*args)
    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", True)
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), cuda_autograd.cuda_gradients(*args), on_cpu):
        assert rel_l2(a, b) < 2e-5, f"{name}: {rel_l2(a, b):.1e}"


def test_cpu_calls_do_not_ask_for_the_switch():
    """``differentiates`` is about CUDA calls: a CPU input that requires grad is differentiated by
    autograd through the float64 path, switch or not."""
    q, k, v, g, beta, h0, do, dht = op_inputs(True, T=10)
    assert not cuda_autograd.differentiates(q.requires_grad_(), k=k, v=v, g=g, beta=beta, initial_state=h0)


def test_l2_normalize_backward_is_autograds():
    x = torch.randn(3, 5, 8, **F64, requires_grad=True)
    dn = torch.randn(3, 5, 8, **F64)
    (want,) = torch.autograd.grad(ref4.l2_normalize(x), x, dn)
    assert rel_l2(backward.l2_normalize_backward(x.detach(), dn), want) < 1e-14


def test_empty_sequence_batch():
    """No token at all: the initial state's gradient is the final state's."""
    q, k, v, g, beta, h0, do, dht = inputs(T=0)
    got = backward.chunked_gradients(q, k, v, g, beta, do, dht, 1.0, h0, dtype=torch.float64)
    assert torch.equal(got[5], dht) and all(x.numel() == 0 for x in got[:5])


@pytest.mark.parametrize("C", [64, 16, 24])
def test_sub_chunked_sums_are_the_pairwise_sums(C):
    """``SubChunked`` against ``Pairwise`` on one chunk of ``C`` rows (a last block shorter than 16 at 24),
    gates with runs of -20 included: the scores with and without the diagonal, and both sums."""
    gen = torch.Generator().manual_seed(C)
    x, y = (torch.randn(3, C, 8, generator=gen, **F64) for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(3, C, 8, generator=gen, **F64))
    g[1, C // 4: C // 2] = -20.0
    G = g.cumsum(-2)
    s = torch.randn(3, C, C, generator=gen, **F64).tril()
    sub, pairwise = backward.SubChunked(G), ref.Pairwise(G)
    for diagonal in (True, False):
        assert rel_l2(sub.scores(x, y, diagonal), pairwise.scores(x, y, diagonal)) < 1e-14
    assert rel_l2(sub.rows(s, y), pairwise.rows(s, y)) < 1e-14
    assert rel_l2(sub.cols(s, x), pairwise.cols(s, x)) < 1e-14


def halved_sums(G, s, x, y, sub):
    """The kernels' walk by halvings (``kda.kernels.halvings``) in float64, one chunk: the row and column sums
    of ``chunk_pair_gradients``' ``halved_pair_sums`` (the pairs inside blocks of ``sub`` rows one by one, the others
    through the upper half's last row of each halving, ``s`` masked to the halving's blocks) and the scores of
    ``chunk_intra``'s ``diagonal_by_halvings`` (pairs ``j < i`` by halvings down to single rows, then ``x_i . y_i``)."""
    from kda.kernels.halvings import halvings

    C = G.shape[-2]
    idx = torch.arange(C)
    inside = (idx[:, None] // sub == idx[None, :] // sub) & (idx[None, :] < idx[:, None])
    E = torch.exp(torch.clamp(G[..., :, None, :] - G[..., None, :, :], max=0.0))        # [.., i, j, d]
    rows = torch.einsum("...ij,...jd,...ijd->...id", s * inside, y, E)
    cols = torch.einsum("...ij,...id,...ijd->...jd", s * inside, x, E)
    scores = torch.einsum("...id,...id->...i", x, y).diag_embed()
    for h in halvings(C, 1):
        last = (idx // (2 * h)) * (2 * h) + h - 1                    # the upper half's last row of each row's block
        lower = (idx > last)[:, None]
        down = torch.where(lower, torch.exp(torch.clamp(G - G[..., last, :], max=0.0)), 0.0)   # 2^(G_i - G_b)
        up = torch.where(lower, 0.0, torch.exp(torch.clamp(G[..., last, :] - G, max=0.0)))    # 2^(G_b - G_j)
        across = (idx[:, None] // (2 * h) == idx[None, :] // (2 * h)) & lower & ~lower.T
        scores = torch.where(across, (x * down) @ (y * up).transpose(-1, -2), scores)
        if h >= sub:
            within = s * (idx[:, None] // (2 * h) == idx[None, :] // (2 * h))
            rows = rows + down * (within @ (y * up))                     # down and up: 0 off their halves
            cols = cols + up * (within.transpose(-1, -2) @ (x * down))
    return rows, cols, scores


@pytest.mark.parametrize("sub", [1, 4, 16])
def test_halvings_are_the_pairwise_sums(sub):
    """The walk by halvings that ``chunk_pair_gradients`` (``halve_to``) and ``chunk_intra`` (``pairwise="halvings"``)
    take, emulated in float64 (``halved_sums``): every pair ``j < i`` met once, with its decay as a product of two
    factors ``<= 1``, so the sums are ``Pairwise``'s for any gate (runs of -20 per token included)."""
    gen = torch.Generator().manual_seed(sub)
    x, y = (torch.randn(3, 64, 8, generator=gen, **F64) for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(3, 64, 8, generator=gen, **F64))
    g[1, 10:40] = -20.0
    G = g.cumsum(-2)
    s = torch.randn(3, 64, 64, generator=gen, **F64).tril(-1)
    rows, cols, scores = halved_sums(G, s, x, y, sub)
    pairwise = ref.Pairwise(G)
    assert rel_l2(rows, pairwise.rows(s, y)) < 1e-14
    assert rel_l2(cols, pairwise.cols(s, x)) < 1e-14
    assert rel_l2(scores, pairwise.scores(x, y, True)) < 1e-14


@pytest.mark.parametrize("lower_bound", [-5.0, -8.0])
def test_diagonal_about_middles_holds_safe_gates(lower_bound):
    """``chunk_intra``'s ``middles`` emulated on one chunk: with every gate at fla's ``safe_gate`` bound (-5 per token,
    the steepest it allows; -8 too), each 16-row sub-chunk falls by more than ``DIAGONAL_SPAN_MAX`` (the diagonal
    about ``G_ref`` would need the pairwise sums) but each half by at most that (``halves_fall_too_far``), and the
    factors about ``middle_row``, rounded to bf16 as the kernel's operands are and multiplied in float32, give the
    diagonal blocks' scores to bf16's rounding of ``Pairwise``'s, no factor leaving float32's range."""
    from kda.kernels.chunk_intra import middle_row, subchunk_falls
    from kda.kernels.stages import DIAGONAL_SPAN_MAX, LOG2_E

    C, BC = 64, 16
    gen = torch.Generator().manual_seed(5)
    x, y = (torch.randn(64, 32, generator=gen, **F64) for _ in range(2))
    g = lower_bound * (1 - 0.02 * torch.rand(64, 32, generator=gen, **F64))     # at the bound, within 2%
    G2 = g.cumsum(0) * LOG2_E                                                   # log2 units, as the kernel
    whole, halves = subchunk_falls(G2, BC)                                      # [C / BC, D]
    assert (whole.amax(-1) > DIAGONAL_SPAN_MAX).all() and (halves <= DIAGONAL_SPAN_MAX).all()
    blocks = torch.arange(C)[:, None] // BC == torch.arange(C)[None, :] // BC
    want = torch.where(blocks, ref.Pairwise(g.cumsum(0)).scores(x, y, True), 0.0)
    got = torch.zeros(C, C, **F64)
    for s in range(C // BC):
        rows = slice(s * BC, s * BC + BC)
        m = middle_row(s * BC, BC)
        left, right = torch.exp2(G2[rows] - G2[m]), torch.exp2(G2[m] - G2[rows])
        assert max(left.max(), right.max()) < 2.0 ** DIAGONAL_SPAN_MAX
        bf16 = lambda t: t.float().bfloat16().float()
        got[rows, rows] = (bf16(x[rows] * left) @ bf16(y[rows] * right).T).double().tril()
    assert torch.isfinite(got).all() and rel_l2(got, want) < 1e-2


def piece_chunks(C, token_major, NC):
    """A state pass's pieces as ``[B, H, NC, C, D]`` float64: from the head-major chunk layout ``[B, H, NC C, D]``,
    or from token-major ``[B, T, H, D]`` (``token_major``), the rows past ``T`` zeros as the kernels load them."""
    if token_major:
        return lambda x: ref.to_chunks(x.double(), C)
    return lambda x: x.reshape(x.shape[0], x.shape[1], NC, C, x.shape[-1]).double()


def gate_in_pieces(C, Q, K, G, scale):
    """What the state kernels compiled with ``gate_in`` make of the op's inputs (``[B, T, H, D]``, ``G [B, T, H, 1]``
    the cumulative gate per chunk, log2), as the pieces of the token-major layout: ``Qg = scale Q 2^G``, ``Kd = K
    2^(G_last - G)`` (``G_last`` the chunk's last real row) and ``decay [B, H, NC, DK]``."""
    T, DK = Q.shape[1], Q.shape[-1]
    NC = -(-T // C)
    Gc = ref.to_chunks(G.double(), C)                                  # [B, H, NC, C, 1], zero past T
    last = torch.tensor([min(C, T - n * C) - 1 for n in range(NC)])
    G_last = Gc[:, :, torch.arange(NC), last]                          # [B, H, NC, 1]
    Qg = ref.from_chunks(scale * ref.to_chunks(Q.double(), C) * torch.exp2(Gc), T)
    Kd = ref.from_chunks(ref.to_chunks(K.double(), C) * torch.exp2(G_last[..., None, :] - Gc), T)
    return Qg, Kd, torch.exp2(G_last).expand(*G_last.shape[:3], DK)


def packed_pass(dense, args, offsets, token_major, delta_rule, C, forward):
    """A state pass's mirror over packed sequences (``varlen``): ``dense`` (the dense mirror) on each sequence's
    chunks, ``offsets[n]`` to ``offsets[n + 1]`` of the batch row, with its own state (``h0``, or ``dht`` and
    ``dh0``) and the whole tensors' views of its chunks."""
    rows = (lambda x, s, e: x[:, s * C:e * C]) if token_major else (lambda x, s, e: x[:, :, s * C:e * C])
    chunk = lambda x, s, e: x[:, :, s:e]
    bounds = offsets.tolist()
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        if forward:
            W, Kd, U, decay, h0, S_in = args
            if e > s:
                dense(rows(W, s, e), rows(Kd, s, e), rows(U, s, e), chunk(decay, s, e), h0[n:n + 1],
                      chunk(S_in, s, e), token_major=token_major, delta_rule=delta_rule)
        else:
            P, Kd, Qg, W, dO, decay, dht, S_in, dS_out, dh0, dG_last = args
            if e == s:                                          # an empty sequence: its gradient passes through
                dh0[n:n + 1].copy_(dht[n:n + 1])
                continue
            dense(*(rows(x, s, e) for x in (P, Kd, Qg, W, dO)), chunk(decay, s, e), dht[n:n + 1], chunk(S_in, s, e),
                  chunk(dS_out, s, e), dh0[n:n + 1], chunk(dG_last, s, e), token_major=token_major,
                  delta_rule=delta_rule)


def forward_states_mirror(C):
    """``kda.kernels.backward_states.forward_states_pass`` for chunks of ``C`` in float64 torch, reading its
    arguments in their head-major chunk layout (or token-major, ``token_major``) and writing ``S_in``; with
    ``gate_in``, its arguments ``K, V, G, h0, S_in`` (``gate_in_pieces``)."""
    def forward_states(*args, token_major=False, delta_rule=True, gate_in=False, varlen=False):
        if gate_in:
            K, V, G, h0, S_in = args
            _, Kd, decay = gate_in_pieces(C, K, K, G, 1.0)
            return forward_states(Kd, Kd, V, decay, h0, S_in, token_major=True, delta_rule=False)
        if varlen:                     # sequence n: chunks offsets[n] to offsets[n + 1], its own h0
            *args, offsets = args
            return packed_pass(forward_states, args, offsets, token_major, delta_rule, C, forward=True)
        W, Kd, U, decay, h0, S_in = args
        chunks = piece_chunks(C, token_major, decay.shape[2])
        Ws = chunks(W) if delta_rule else torch.zeros_like(chunks(W))      # without the delta rule: W not read
        S_in.copy_(ref.forward_states({"W": Ws, "Kd": chunks(Kd), "U": chunks(U), "decay": decay.double()},
                                      h0.double())[0])
    return forward_states


def reverse_state_pass_mirror(C, block_dv=64):
    """``kda.kernels.backward_states.reverse_state_pass`` for chunks of ``C`` in float64 torch; with the
    arguments of ``chunk_decay_terms=True`` (``S_in`` before ``dS_out``, ``dG_last`` after ``dh0``) each chunk
    decay's gate term too, per ``block_dv`` value columns, from ``dS`` before it is rounded to ``dS_out``. With
    ``gate_in``, its arguments ``Q, dO, G, scale, dht, S_in, dS_out, dh0, dG_last`` (``gate_in_pieces``)."""
    def reverse(*args, token_major=False, delta_rule=True, gate_in=False, varlen=False):
        if varlen:
            *args, offsets = args
            return packed_pass(reverse, args, offsets, token_major, delta_rule, C, forward=False)
        if gate_in:
            Q, dO, G, scale, dht, *outputs = args
            Qg, _, decay = gate_in_pieces(C, Q, Q, G, scale)
            unread = Qg.new_zeros(*Qg.shape[:3], C)                          # P: not read without the delta rule
            return reverse(unread, Qg, Qg, Qg, dO, decay, dht, *outputs, token_major=True, delta_rule=False)
        P, Kd, Qg, W, dO, decay, dht, *outputs = args
        S_in, dS_out, dh0, dG_last = outputs if len(outputs) == 4 else (None, *outputs, None)
        chunks = piece_chunks(C, token_major, decay.shape[2])
        unread = (lambda x: torch.zeros_like(chunks(x))) if not delta_rule else chunks   # P, Kd, W: not read
        part = {"P": unread(P), "Kd": unread(Kd), "Qg": chunks(Qg), "W": unread(W), "decay": decay.double(),
                "U": chunks(dO)}
        out, first = ref.reverse_state_pass(part, chunks(dO), dht.double())
        if dG_last is not None:
            blocks = lambda x: x.reshape(*x.shape[:-1], -1, block_dv).transpose(-2, -3)    # [.., NBV, DK, block]
            dG_last.copy_((blocks(S_in.double()) * blocks(out)).sum(-1) * decay.double()[:, :, :, None])
        dS_out.copy_(out)
        dh0.copy_(first)
    return reverse


def test_kernel_state_passes_bind_the_kernels_arguments(monkeypatch):
    """``kernel_state_passes`` on the CPU, the two kernels replaced by torch stand-ins that read their
    arguments as the kernels' docstrings say (head-major chunk layout, the order of the signature):
    the states and gradients equal the reference's passes, for a gate per channel and per head."""
    from kda.kernels import backward_states
    from kda.kernels import build

    fakes = {backward_states.forward_states_pass: forward_states_mirror(16),
             backward_states.reverse_state_pass: reverse_state_pass_mirror(16)}
    monkeypatch.setattr(build, "compile_program", lambda fn, out_idx, **kw: fakes[fn])
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
    monkeypatch.setattr(backward, "STATE_KERNELS_DTYPE", torch.float64)
    for per_channel in (True, False):
        q, k, v, g, beta, h0, do, dht = inputs(T=64, V=64, per_channel=per_channel)
        p = ref.chunk_pieces(q, k, v, g, beta, 0.5, 16)
        whole = {name: p[name] for name in backward.STATE_PIECES}
        dO = ref.to_chunks(do, 16)
        S, dS, dh0, _ = backward.kernel_state_passes(whole, h0, dO, dht)
        want_S = ref.forward_states(p, h0)[0]
        want_dS, want_dh0 = ref.reverse_state_pass(p, dO, dht)
        for got, want in ((S, want_S), (dS, want_dS), (dh0, want_dh0)):   # float32 states: ~1e-8
            assert rel_l2(got, want) < 1e-6


def strong_gate_dg_errors(T, per_channel, draws):
    """float32 ``dg`` of ``op_gradients`` against the float64 recurrence, gates uniform in [-20, 0]
    (H = 2, K = V = 64), one relative L2 error per draw (results/tuning/backward-dg-float32.py too)."""
    errors = []
    for seed in range(draws):
        gen = torch.Generator().manual_seed(seed)
        q, k, v, g, beta, h0, do, dht = inputs(B=1, T=T, H=2, K=64, V=64, seed=seed, per_channel=per_channel)
        g = -20 * torch.rand(g.shape, generator=gen, **F64)
        want = ref.recurrence_backward(q, k, v, g, beta, do, dht, 0.125, h0)[3]
        errors.append(rel_l2(backward.op_gradients(q, k, v, g, beta, 0.125, h0, False, None, do, dht)[3], want))
    return errors


@pytest.mark.parametrize("T", [1, 5, 70])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_float32_gate_gradient_of_strong_gates(T, per_channel):
    """Gates uniform in [-20, 0]: a token's true ``dg`` can be 1e-5 next to terms of order 10. The
    float32 stages keep it within 1e-4 (no two large terms cancel: the diagonal pairs are left out of
    ``dG`` and the decay to the chunk's end is added as a prefix sum), over twenty draws."""
    worst = max(strong_gate_dg_errors(T, per_channel, 20))
    assert worst < 1e-4, f"dg: {worst:.1e}"


@pytest.mark.parametrize("switch", [False, True])
def test_gate_weights_get_gradients_whatever_the_switch(switch, monkeypatch):
    """A model's call (raw gate, ``A_log``, ``dt_bias``) on the CPU: the activation's weights are in the
    graph with the CUDA backward's switch on or off (its input checks run under ``no_grad`` only for
    a call that goes through the op, and build nothing)."""
    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", switch)
    q, k, v, g, beta, h0, do, dht = inputs(B=1, T=20, H=2, K=4, V=3)
    A_log = torch.log(torch.tensor([2.0, 5.0], **F64)).requires_grad_()
    dt_bias = (0.1 * torch.randn(8, **F64)).requires_grad_()
    o, _ = kda.chunk_kda(q, k, v, torch.randn(1, 20, 2, 4, **F64), beta, A_log=A_log, dt_bias=dt_bias,
                         use_gate_in_kernel=True)
    grads = torch.autograd.grad((o * do).sum(), (A_log, dt_bias))
    assert all(torch.isfinite(x).all() and x.abs().sum() > 0 for x in grads)


def chunk_rows(x, C, NC, T):
    """``[B, T, H, *]`` as ``[B, H, NC, C, *]`` in float64, rows past ``T`` zero (as the kernels mask them)."""
    B, H = x.shape[0], x.shape[2]
    x = torch.nn.functional.pad(x.double(), (0, 0) * (x.dim() - 3) + (0, 0, 0, NC * C - T))
    return x.view(B, NC, C, H, *x.shape[3:]).movedim(3, 1)


def rows_back(x, out, T):
    """``[B, H, NC, C, *]`` written to ``out [B, T, H, *]`` (the rows past ``T`` dropped)."""
    B, H, NC, C = x.shape[:4]
    out.copy_(x.movedim(1, 3).reshape(B, NC * C, H, *x.shape[4:])[:, :T])


def pair_decays(G):
    """``E_ijd = 2^(G_id - G_jd)`` for ``j <= i``, else 0: ``G [..., C, D]`` in log2 units."""
    C = G.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool).tril()[..., None]
    return torch.where(lower, torch.exp2(torch.clamp(G[..., :, None, :] - G[..., None, :, :], max=0.0)), 0.0)


def chunk_kernel_mirror(Q, K, V, dO, g, beta, S_in, dS_out, *rest, C=64, delta_rule=True, pieces_in=False):
    """``kda.kernels.backward_chunks.chunk_gradients`` step by step in float64 torch, reading and writing
    its arguments as its docstring says (a gate per head, natural log, per token; its outputs per row):
    the stand-in that checks the kernel's arithmetic and ``kernel_chunk_gradients``'s binding on the CPU.
    ``delta_rule=False``: ``V' = V``, ``dV = dV'``, ``beta`` not read and ``db`` not written. ``pieces_in``:
    ``Tinv, KKE, P`` read after ``dS_out`` (the forward's), instead of made from ``q`` and ``k``."""
    given, rest = (rest[:3], rest[3:]) if pieces_in else (None, rest)
    scale, dQ, dK, dV, db, dG, to_end, flags = rest
    B, T, H, DK = Q.shape
    NC = S_in.shape[2]
    q, k, v, do = (chunk_rows(x, C, NC, T) for x in (Q, K, V, dO))
    G = chunk_rows(g, C, NC, T)[..., 0].cumsum(-1)                                  # [B, H, NC, C]
    S, dS = S_in.double(), dS_out.double()
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    E = torch.where(lower, torch.exp(torch.clamp(G[..., :, None] - G[..., None, :], max=0.0)), 0.0)
    strict = lambda x: x.tril(-1)
    tr = lambda x: x.transpose(-1, -2)
    eG, eEnd = torch.exp(G)[..., None], torch.exp(G[..., -1:] - G)[..., None]
    if delta_rule:
        b = chunk_rows(beta, C, NC, T)
        KKE = strict(k @ tr(k) * E)
        Tinv = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + KKE * b[..., None])
        if pieces_in:                                   # the forward's, rows past the end zero (not read)
            Tinv, KKE = chunk_rows(given[0], C, NC, T), chunk_rows(given[1], C, NC, T)
        Kg = k * eG
        W, U = (Tinv * b[..., None, :]) @ Kg, (Tinv * b[..., None, :]) @ v
        new = U - W @ S
    else:
        new = v
    dQg = do @ tr(S)
    dq, dg = dQg * eG, scale * torch.exp(G) * (dQg * q).sum(-1)
    P = scale * (q @ tr(k)) * E if not pieces_in else chunk_rows(given[2], C, NC, T)
    dnew = tr(P) @ do + (k * eEnd) @ dS
    dk = (new @ tr(dS)) * eEnd
    end = (dk * k).sum(-1)
    dP = do @ tr(new)
    R = strict(dP) * P
    dg = dg + R.sum(-1) - R.sum(-2)
    dPE = dP.tril() * E
    dq, dk = dq + dPE @ k, dk + scale * tr(dPE) @ q
    if not delta_rule:
        for x, out in ((dq * scale, dQ), (dk, dK), (dnew, dV), (dg, dG), (end, to_end)):
            rows_back(x, out, T)
        return
    dW = -dnew @ tr(S)
    dXu, dXw = tr(Tinv) @ dnew, tr(Tinv) @ dW
    dv, dbeta = b[..., None] * dXu, (dXu * v).sum(-1)
    dk = dk + dXw * b[..., None] * eG
    share = torch.exp(G) * (dXw * k).sum(-1)
    dbeta, dg = dbeta + share, dg + share * b
    dT = dnew @ tr(b[..., None] * v) + dW @ tr(b[..., None] * Kg)
    dA = -strict(tr(Tinv) @ dT @ tr(Tinv))
    D = dA * KKE
    dbeta = dbeta + D.sum(-1)
    dg = dg + b * D.sum(-1) - (b[..., None] * D).sum(-2)
    dAbE = dA * b[..., None] * E
    dk = dk + dAbE @ k + tr(dAbE) @ k
    for x, out in ((dq * scale, dQ), (dk, dK), (dv, dV), (dbeta, db), (dg, dG), (end, to_end)):
        rows_back(x, out, T)


def assert_gradients_agree(got, want, bound=1e-2):
    """``op_gradients``' six results against another path's: the same presence, dtype and shape, finite,
    within ``bound`` relative L2 (the kernels' rounding of their operands to bf16)."""
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert (a is None) == (b is None), name
        if b is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.isfinite(a).all(), name
            assert rel_l2(a.double(), b.double()) < bound, f"{name}: {rel_l2(a.double(), b.double()):.1e}"


# the switches that went on after run 103 (kda.backward): a test of an earlier switch sets them off, to test it as
# it was written (each of them has a test of its own below)
RUN103_ON = ("SCORES_FROM_FORWARD", "PAIR_PIECES_FROM_FORWARD", "INVERSE_FROM_FORWARD", "PAIR_KERNEL_BY_CHANNELS",
             "GRADS_IN_INPUT_DTYPE", "LEVEL_PASSES_FROM_INPUTS", "PACKED_STATE_KERNELS")


def later_switches_off(monkeypatch):
    for name in RUN103_ON:
        monkeypatch.setattr(backward, name, False)


def every_mirror():
    """Every backward kernel by its float64 mirror (the state passes' in value blocks of 64)."""
    from kda.kernels import backward_chunks, backward_states

    return {backward_states.forward_states_pass: forward_states_mirror(64),
            backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
            backward_chunks.chunk_gradients: chunk_kernel_mirror,
            backward_chunks.chunk_pair_pieces: pair_pieces_mirror,
            backward_chunks.chunk_state_gradients: state_gradients_mirror,
            backward_chunks.chunk_pair_gradients: pair_gradients_mirror}


def fake_kernels(monkeypatch, fakes, prepare_chunks=None):
    """CUDA faked and every kernel replaced by its stand-in in ``fakes``, handed the compile flags it takes
    (``token_major``, ``delta_rule``, ``scores``, ``pieces_in``, ``gate_in``, ``varlen``); the forward's ``chunk_intra`` by ``prepare_chunks``
    (default: its mirror). Returns ``{kernel name: compile kwargs}``, the last compile of each."""
    from kda import gated_delta
    from kda.kernels import build

    compiled = {}

    def compile_program(fn, out_idx, **kw):
        compiled[fn.__name__] = kw
        takes = inspect.signature(fakes[fn]).parameters
        any_flag = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
        return functools.partial(fakes[fn], **{name: kw[name] for name in ("token_major", "delta_rule", "scores",
                                                                            "pieces_in", "gate_in", "varlen")
                                               if name in kw and (any_flag or name in takes)})

    monkeypatch.setattr(build, "compile_program", compile_program)
    monkeypatch.setattr(gated_delta, "L2NORM_KERNEL", False)     # the norm's kernel has tests of its own
    monkeypatch.setattr("kda.kernels.chunk_intra.prepare_chunks", prepare_chunks or prepare_chunks_mirror())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    return compiled


def pair_pieces_mirror(Q, K, g, beta, scale, G, Tinv, P, KKE, flags, C=64, delta_rule=True, scores=True):
    """``kda.kernels.backward_chunks.chunk_pair_pieces`` in float64 torch, reading and writing its
    arguments as its docstring says: ``G [B, H, NC C, DK]`` (log2, flat past the end), ``T``, the scores
    ``P`` (scale in, ``j <= i``) and ``stril(K K^T E)`` per row ``[B, T, H, C]``; without the delta rule
    ``G`` and ``P`` only; ``scores=False``: ``P`` not written."""
    B, T, H, DK = Q.shape
    NC = G.shape[2] // C
    q, k = chunk_rows(Q, C, NC, T), chunk_rows(K, C, NC, T)
    Gc = chunk_rows(g, C, NC, T).cumsum(-2) / math.log(2)                   # [B, H, NC, C, DK]
    E = pair_decays(Gc)
    P_c = scale * torch.einsum("bhnid,bhnjd,bhnijd->bhnij", q, k, E)
    G.copy_(Gc.reshape(B, H, NC * C, DK))
    if scores:
        rows_back(P_c, P, T)
    if delta_rule:
        KKE_c = torch.einsum("bhnid,bhnjd,bhnijd->bhnij", k, k, E).tril(-1)
        Tinv_c = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + chunk_rows(beta, C, NC, T)[..., None] * KKE_c)
        for x, out in ((Tinv_c, Tinv), (KKE_c, KKE)):
            rows_back(x, out, T)


def state_gradients_mirror(Q, K, V, dO, G, beta, S_in, dS_out, Tinv, P, KKE, scale, dQ, dK, dV, db, dG, to_end,
                           dPs, dAb, C=64, delta_rule=True):
    """``kda.kernels.backward_chunks.chunk_state_gradients`` in float64 torch: every term of
    ``kda.reference.backward.chunk_gradients`` but the pair sums, which it leaves to
    ``chunk_pair_gradients`` through ``dPs = stril(dP)`` and ``dAb = dA b``; ``dQ`` without the scale.
    Without the delta rule ``V' = V``, ``dV = dV'``, and ``db``, ``dAb`` are not written."""
    B, T, H, DK = Q.shape
    NC = S_in.shape[2]
    q, k, v, do = (chunk_rows(x, C, NC, T) for x in (Q, K, V, dO))
    Pm = chunk_rows(P, C, NC, T)
    Gc = G.double().view(B, H, NC, C, DK)
    e, eEnd = torch.exp2(Gc), torch.exp2(Gc[..., -1:, :] - Gc)
    S, dS = S_in.double(), dS_out.double()
    tr = lambda x: x.transpose(-1, -2)
    Kg, Kd = k * e, k * eEnd
    if delta_rule:
        b, Tm, KKEm = chunk_rows(beta, C, NC, T), chunk_rows(Tinv, C, NC, T), chunk_rows(KKE, C, NC, T)
        W, U = Tm @ (b[..., None] * Kg), Tm @ (b[..., None] * v)
        new = U - W @ S
    else:
        new = v
    dQg = do @ tr(S)
    dP = (do @ tr(new)).tril()
    d = torch.diagonal(dP, dim1=-2, dim2=-1)[..., None]
    dq, dk, dg = dQg * e + d * k, scale * d * q, dQg * scale * q * e
    dnew = tr(Pm) @ do + Kd @ dS
    dKd = new @ tr(dS)
    dk = dk + dKd * eEnd
    end = dKd * Kd
    if not delta_rule:
        for x, out in ((dq, dQ), (dk, dK), (dnew, dV), (dg, dG), (end, to_end), (dP.tril(-1), dPs)):
            rows_back(x, out, T)
        return
    dW = -dnew @ tr(S)
    dXu, dXw = tr(Tm) @ dnew, tr(Tm) @ dW
    dv, dKg = b[..., None] * dXu, b[..., None] * dXw
    dk, dg = dk + dKg * e, dg + dKg * Kg
    dbeta = (dXu * v).sum(-1) + (dXw * Kg).sum(-1)
    dT = dnew @ tr(b[..., None] * v) + dW @ tr(b[..., None] * Kg)
    dA = -(tr(Tm) @ dT @ tr(Tm)).tril(-1)
    dbeta = dbeta + (dA * KKEm).sum(-1)
    for x, out in ((dq, dQ), (dk, dK), (dv, dV), (dbeta, db), (dg, dG), (end, to_end), (dP.tril(-1), dPs),
                   (dA * b[..., None], dAb)):
        rows_back(x, out, T)


def pair_gradients_mirror(Q, K, G, dPs, dAb, scale, dQ, dK, dG, *finish, C=64, delta_rule=True):
    """``kda.kernels.backward_chunks.chunk_pair_gradients`` in float64 torch: the pair sums of ``dPs`` and
    ``dAb`` (``rows(s, y)_i = sum_j s_ij y_j E_ij``, ``cols(s, x)_j = sum_i s_ij x_i E_ij``) added to
    ``dQ`` (then scaled), ``dK`` and ``dG``; without the delta rule those of ``dPs`` only. With the arguments
    of ``finish_gate`` (``to_end``, ``dG_last``), ``dG`` then made the gate's gradient by ``gate_gradient``."""
    B, T, H, DK = Q.shape
    NC = G.shape[2] // C
    q, k = chunk_rows(Q, C, NC, T), chunk_rows(K, C, NC, T)
    sP = chunk_rows(dPs, C, NC, T)
    sA = chunk_rows(dAb, C, NC, T) if delta_rule else torch.zeros_like(sP)
    E = pair_decays(G.double().view(B, H, NC, C, DK))
    rows = lambda s, y: torch.einsum("bhnij,bhnjd,bhnijd->bhnid", s, y, E)
    cols = lambda s, x: torch.einsum("bhnij,bhnid,bhnijd->bhnjd", s, x, E)
    qs = scale * q
    rP, cP, rA, cA = rows(sP, k), cols(sP, qs), rows(sA, k), cols(sA, k)
    dq, dk, dg = (chunk_rows(x, C, NC, T) for x in (dQ, dK, dG))
    rows_back(scale * (dq + rP), dQ, T)
    rows_back(dk + cP + rA + cA, dK, T)
    rows_back(dg + qs * rP - k * cP + k * rA - k * cA, dG, T)
    if finish:
        to_end, dG_last = finish
        dG.copy_(backward.gate_gradient(dG.double(), to_end.double(), dG_last.double(), C))


@pytest.fixture
def mirrored_chunk_kernels(monkeypatch):
    """CUDA faked for the chunk stage: every kernel of ``kda.kernels.backward_chunks`` compiles to its mirror,
    with the ``delta_rule`` it was compiled for (the set of those, returned, grows with each compile);
    ``torch.cuda.device`` a no-op and float64 a kernel dtype."""
    import contextlib
    import functools

    from kda.kernels import backward_chunks as kernels, build

    mirrors = {kernels.chunk_gradients: chunk_kernel_mirror, kernels.chunk_pair_pieces: pair_pieces_mirror,
               kernels.chunk_state_gradients: state_gradients_mirror,
               kernels.chunk_pair_gradients: pair_gradients_mirror}
    compiled_with = set()

    def compile_program(fn, out_idx, **kw):
        compiled_with.add(kw.get("delta_rule", True))
        return functools.partial(mirrors[fn], delta_rule=kw.get("delta_rule", True))

    monkeypatch.setattr(build, "compile_program", compile_program)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(launch, "dtype_name", lambda dt: str(dt).removeprefix("torch."))      # float64 too
    return compiled_with


def rounded_chunk_stage(per_channel, strong, seed, gate_scale=1.0):
    """The chunk stage's inputs on bf16-exact values (a tail chunk): ``q, k, v, g, beta, do``, the pieces
    ``p``, the states ``S`` and state gradients ``dS`` rounded to bf16, and ``dO`` by chunks."""
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=100, H=2, K=16, V=8, per_channel=per_channel, strong=strong,
                                           seed=seed)
    bf16 = lambda x: x.to(torch.bfloat16).double()
    q, k, v, do = (bf16(x) for x in (q, k, v, do))
    g, beta = (g * gate_scale).float().double(), beta.float().double()
    p = ref.chunk_pieces(q, k, v, g, beta, 0.5, 64)
    S = bf16(ref.forward_states(p, bf16(h0))[0])
    dO = ref.to_chunks(do, 64)
    dS = bf16(ref.reverse_state_pass(p, dO, dht)[0])
    return q, k, v, g, beta, do, p, S, dS, dO


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("strong", [False, True], ids=["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_chunk_kernel_arithmetic_is_the_chunk_gradients(per_channel, strong, dtype, mirrored_chunk_kernels):
    """``kernel_chunk_gradients`` (a gate per head) and ``kernel_chunk_gradients_by_channel`` with their
    kernels replaced by mirrors (their steps in float64 torch, reading and writing their arguments), then
    ``gate_gradient``: the gradients of ``chunked_gradients`` on the same (bf16-exact) inputs, states and
    state gradients, a tail chunk included: to float32's rounding (the outputs), and per channel to bf16's
    where the three kernels hand each other bf16 (T, P, dP, dA b)."""
    q, k, v, g, beta, do, p, S, dS, dO = rounded_chunk_stage(per_channel, strong, 6 if per_channel else 5)
    want_dQ, want_dK, want_dV, want_db, want_dG = ref.chunk_gradients(p, S, dS, dO)
    stage = backward.kernel_chunk_gradients_by_channel if per_channel else backward.kernel_chunk_gradients
    got = stage(q, k, v, g, beta, do, S, dS, 0.5, dtype)
    T = q.shape[1]
    dg = ref.from_chunks(want_dG, T)
    want = (ref.from_chunks(want_dQ, T) * 0.5, ref.from_chunks(want_dK, T), ref.from_chunks(want_dV, T),
            dg if per_channel else dg[..., 0], ref.from_chunks(want_db[..., None], T)[..., 0])
    bound = (2e-2 if dtype == torch.bfloat16 else 1e-5) if per_channel else 1e-6
    for name, a, b in zip("dq dk dv dg dbeta".split(), got, want):
        assert a.shape == b.shape and rel_l2(a, b) < bound, f"{name}: {rel_l2(a, b):.1e}"
    assert set(mirrored_chunk_kernels) == {True}                  # every kernel compiled with the delta rule


@pytest.mark.parametrize("gates", ["faint", "strong"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_gate_in_pair_kernel_arithmetic(dtype, gates, mirrored_chunk_kernels, monkeypatch):
    """``GATE_IN_PAIR_KERNEL``: ``chunk_pair_gradients`` (its mirror) gets each chunk decay's term and
    ``to_end`` and leaves the gate's gradient itself, as ``chunked_gradients`` makes it (a tail chunk); faint
    gates (a chunk decays by about e^-0.5, so that its decay's term counts) and strong ones."""
    monkeypatch.setattr(backward, "GATE_IN_PAIR_KERNEL", True)
    gate_gradient = backward.gate_gradient
    calls = []
    monkeypatch.setattr(backward, "gate_gradient", lambda *a: calls.append(1) or gate_gradient(*a))
    q, k, v, g, beta, do, p, S, dS, dO = rounded_chunk_stage(True, gates == "strong", 7,
                                                             0.01 if gates == "faint" else 1.0)
    want = ref.from_chunks(ref.chunk_gradients(p, S, dS, dO)[4], q.shape[1])
    got = backward.kernel_chunk_gradients_by_channel(q, k, v, g, beta, do, S, dS, 0.5, dtype)[3]
    assert rel_l2(got, want) < (2e-2 if dtype == torch.bfloat16 else 1e-5), f"dg: {rel_l2(got, want):.1e}"
    assert calls == [1]                                           # once, by the mirror: not by the stage
    if gates == "faint":
        assert p["decay"].min() > 0.3                             # the chunk decays' terms count



@pytest.mark.parametrize("gate", ["none", "per_head", "per_channel"])
def test_chunk_kernel_arithmetic_without_the_delta_rule(gate, mirrored_chunk_kernels):
    """Levels 1-3 (``beta=None``): ``kernel_chunk_gradients`` (no gate or a gate per head) and
    ``kernel_chunk_gradients_by_channel`` with their kernels' no-delta-rule forms replaced by their mirrors,
    then ``gate_gradient``: the gradients of the reference's ``chunk_gradients``, a tail chunk included; no
    ``dbeta``."""
    q, k, v, g, _, h0, do, dht = inputs(B=2, T=100, H=2, K=16, V=8, per_channel=gate == "per_channel", seed=8)
    g = None if gate == "none" else g
    p = ref.chunk_pieces(q, k, v, g, None, 0.5, 64)
    S = ref.forward_states(p, h0)[0]
    dO = ref.to_chunks(do, 64)
    dS = ref.reverse_state_pass(p, dO, dht)[0]
    want_dQ, want_dK, want_dV, want_db, want_dG = ref.chunk_gradients(p, S, dS, dO)
    if gate == "per_channel":
        stage = backward.kernel_chunk_gradients_by_channel
    else:
        stage = backward.kernel_chunk_gradients
        g = g if g is not None else torch.zeros(q.shape[:3], **F64)
    dq, dk, dv, dg, db = stage(q, k, v, g, None, do, S, dS, 0.5, torch.float64)
    T = q.shape[1]
    assert db is None and want_db is None
    want = [ref.from_chunks(want_dQ, T) * 0.5, ref.from_chunks(want_dK, T), ref.from_chunks(want_dV, T)]
    got = [dq, dk, dv]
    if gate != "none":
        want_g = ref.from_chunks(want_dG, T)
        got, want = got + [dg], want + [want_g if gate == "per_channel" else want_g[..., 0]]
    for name, a, b in zip("dq dk dv dg".split(), got, want):
        assert a.shape == b.shape and rel_l2(a, b) < 1e-6, f"{name}: {rel_l2(a, b):.1e}"
    assert mirrored_chunk_kernels == {False}                      # every kernel compiled without it


def test_chunk_kernel_is_taken_only_where_it_applies(monkeypatch):
    """The switch, then CUDA, a gate per head (or none), chunks of 64 and bf16 or fp16 inputs: each one
    missing keeps the torch stages; with or without the delta rule (packed sequences take it:
    test_chunk_kernel_takes_packed_sequences)."""
    q = torch.zeros(1, 64, 2, 8)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    args = dict(q=q, g=torch.zeros(1, 64, 2), beta=torch.zeros(1, 64, 2), C=64, kernel_dtype=torch.bfloat16)
    assert not backward.chunk_kernel_applies(**args)
    monkeypatch.setattr(backward, "CHUNK_KERNEL", True)
    assert backward.chunk_kernel_applies(**args)
    assert backward.chunk_kernel_applies(**{**args, "g": None})
    assert backward.chunk_kernel_applies(**{**args, "beta": None})              # levels 1-3
    monkeypatch.setattr(backward, "FORWARD_PIECES", True)
    assert backward.forward_pieces_apply(q, args["beta"], 64, torch.bfloat16)
    assert not backward.forward_pieces_apply(q, None, 64, torch.bfloat16)      # the forward's pieces need beta
    for change in [dict(g=torch.zeros(1, 64, 2, 8)), dict(C=16), dict(kernel_dtype=torch.float32)]:
        assert not backward.chunk_kernel_applies(**{**args, **change}), change


def prepare_chunks_mirror(rounded=True):
    """``kda.kernels.chunk_intra.prepare_chunks`` (the forward's ``chunk_intra``) made from the reference's pieces
    in float64, in its token-major layout; in its dtypes (those of ``q``, the decays float32) where
    ``rounded``, else in float64. With ``backward_outputs``, ``(form, G, Tinv, KKE)`` as the kernel compiled
    with that flag returns them (by ``pair_pieces_mirror``)."""
    from kda.kernels.chunk_intra import ChunkForm

    def prepare_chunks(q, k, v, g, beta, scale, backward_outputs=False):
        B, T, H, DK = q.shape
        p = ref.chunk_pieces(q.double(), k.double(), v.double(), g[..., 0] if g.shape[-1] == 1 else g, beta, scale,
                             64)
        out = q.dtype if rounded else torch.float64
        rows = lambda x: x.permute(0, 2, 3, 1, 4).reshape(B, -1, H, x.shape[-1])[:, :T].to(out)
        decay = p["decay"].expand(*p["decay"].shape[:3], q.shape[-1]).to(torch.float32 if rounded else out)
        form = ChunkForm(rows(p["Qg"]), rows(p["Kd"]), rows(p["W"]), rows(p["U"]), rows(p["P"]), decay)
        if not backward_outputs:
            return form
        # the kernel's backward outputs, as chunk_pair_pieces writes them (G float32, T in q's dtype, KKE float32)
        NC = -(-T // 64)
        G, KKE = torch.empty(B, H, NC * 64, DK, dtype=torch.float64), torch.empty(B, T, H, 64, dtype=torch.float64)
        Tinv = torch.empty(B, T, H, 64, dtype=torch.float64)
        pair_pieces_mirror(q, k, g.expand(B, T, H, DK), beta, scale, G, Tinv, None, KKE, None, scores=False)
        low = torch.float32 if rounded else torch.float64
        return form, G[..., :g.shape[-1]].to(low), Tinv.to(out), KKE.to(low)
    return prepare_chunks


def test_kernels_by_channel_are_taken_only_where_they_apply(monkeypatch):
    """The switch, then CUDA, a gate per channel, chunks of 64, bf16 or fp16 inputs and heads of at most
    128 (the state kernel's shared memory): each one missing keeps the torch stages; with or without the
    delta rule."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    args = dict(q=torch.zeros(1, 64, 2, 128), g=torch.zeros(1, 64, 2, 128), beta=torch.zeros(1, 64, 2), C=64,
                kernel_dtype=torch.bfloat16, DV=128)
    assert not backward.channel_kernels_apply(**args)
    monkeypatch.setattr(backward, "CHUNK_KERNELS_BY_CHANNEL", True)
    assert backward.channel_kernels_apply(**args)
    assert backward.channel_kernels_apply(**{**args, "beta": None})             # level 3
    for change in [dict(g=torch.zeros(1, 64, 2)), dict(g=None), dict(C=16),
                   dict(kernel_dtype=torch.float32), dict(DV=256), dict(q=torch.zeros(1, 64, 2, 256))]:
        assert not backward.channel_kernels_apply(**{**args, **change}), change

def test_forward_pieces_are_the_state_pieces(monkeypatch):
    """``forward_pieces`` with ``prepare_chunks`` replaced by a stand-in that returns the forward's
    ``ChunkForm`` in its token-major layout (made from the reference's pieces): the state passes'
    pieces in their head-major chunk layout, a tail chunk's rows past the end zero; then
    ``chunked_gradients`` with ``FORWARD_PIECES`` gives the gradients of the torch pieces."""
    monkeypatch.setattr("kda.kernels.chunk_intra.prepare_chunks", prepare_chunks_mirror(rounded=False))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    for per_channel in (True, False):
        q, k, v, g, beta, h0, do, dht = inputs(T=100, K=16, V=8, per_channel=per_channel)
        g = g.float().double()                               # the kernel takes a float32 gate
        q, k, v = (x.to(torch.bfloat16).double() for x in (q, k, v))     # and bf16 inputs
        want = ref.chunk_pieces(q, k, v, g, beta, 0.5, 64)
        got = backward.forward_pieces(q, k, v, g, beta, 0.5, torch.float64)
        for name in backward.STATE_PIECES:
            wide = want[name].expand_as(got[name])          # a gate per head: one decay, widened to DK
            assert got[name].shape == wide.shape and rel_l2(got[name], wide) < 1e-12, name
        plain = backward.chunked_gradients(q, k, v, g, beta, do, dht, 0.5, h0, dtype=torch.float64)
        monkeypatch.setattr(backward, "FORWARD_PIECES", True)
        through = backward.chunked_gradients(q, k, v, g, beta, do, dht, 0.5, h0, dtype=torch.float64,
                                             kernel_dtype=torch.bfloat16)
        monkeypatch.setattr(backward, "FORWARD_PIECES", False)
        for a, b in zip(through, plain):
            assert rel_l2(a, b) < 1e-12


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_chunk_kernel_takes_packed_sequences(per_channel, monkeypatch):
    """``op_gradients`` on packed sequences (an empty one, one of length 1, tails) with ``CHUNK_KERNEL`` on
    (a gate per head) or ``CHUNK_KERNELS_BY_CHANNEL``, the kernels replaced by their mirrors (CUDA faked):
    the gradients of the torch stages, to the rounding to bf16 of what the kernels read and hand on."""
    from kda.kernels import backward_chunks, build

    fakes = {backward_chunks.chunk_gradients: chunk_kernel_mirror,
             backward_chunks.chunk_pair_pieces: pair_pieces_mirror,
             backward_chunks.chunk_state_gradients: state_gradients_mirror,
             backward_chunks.chunk_pair_gradients: pair_gradients_mirror}
    lengths = [0, 1, 63, 130, 70]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q, k, v, g, beta, h0, do, dht = op_inputs(per_channel, T=sum(lengths), seed=4)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    h0, dht = (torch.randn(len(lengths), *x.shape[1:], dtype=torch.float64) for x in (h0, dht))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), True, cu, do.float(), dht.float())
    want = backward.op_gradients(*args)
    compiled = []
    monkeypatch.setattr(build, "compile_program", lambda fn, out_idx, **kw: compiled.append(fn.__name__) or fakes[fn])
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(backward, "CHUNK_KERNELS_BY_CHANNEL" if per_channel else "CHUNK_KERNEL", True)
    got = backward.op_gradients(*args)
    assert compiled == (["chunk_pair_pieces", "chunk_state_gradients", "chunk_pair_gradients"] if per_channel
                        else ["chunk_gradients"])
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        assert rel_l2(a.double(), b.double()) < 1e-2, f"{name}: {rel_l2(a.double(), b.double()):.1e}"   # ~3e-3

@pytest.mark.parametrize("token_major", [False, True], ids=["head_major", "token_major"])
@pytest.mark.parametrize("delta_rule", [True, False], ids=["delta_rule", "no_delta_rule"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_states_as_operands(per_channel, delta_rule, token_major, monkeypatch):
    """``STATES_AS_OPERANDS`` (CUDA faked, every kernel replaced by its float64 mirror): the state passes are
    compiled to write both states in bf16 and the reverse pass with the chunk decays' gate terms; the chunk
    kernels read those states as they are (no rounding copy) and no einsum over them runs; the gradients are
    those with float32 states, to the rounding of the states to bf16. ``token_major``: with
    ``TOKEN_MAJOR_STATES`` too (the forward's pieces and ``do`` read as they are, where they come from the
    forward's kernel: with the delta rule)."""
    compiled = fake_kernels(monkeypatch, every_mirror())
    later_switches_off(monkeypatch)
    einsums = []
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=128, seed=6, per_channel=per_channel)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))     # two blocks of value columns
    beta = beta.float() if delta_rule else None                              # levels 1-3: no delta rule
    args = (q, k, v, g.float(), beta, 0.5, h0.float(), delta_rule, None, do, dht.float())
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL"):
        monkeypatch.setattr(backward, switch, True)
    for switch in ("STATES_AS_OPERANDS", "TOKEN_MAJOR_STATES"):          # the float32 states of before
        monkeypatch.setattr(backward, switch, False)
    want = backward.op_gradients(*args)
    compiled.clear()
    monkeypatch.setattr(backward, "STATES_AS_OPERANDS", True)
    monkeypatch.setattr(backward, "TOKEN_MAJOR_STATES", token_major)
    einsum = torch.einsum
    monkeypatch.setattr(torch, "einsum", lambda *a, **kw: einsums.append(a[0]) or einsum(*a, **kw))
    got = backward.op_gradients(*args)
    assert compiled["forward_states_pass"]["state_dtype"] == "bfloat16"
    assert compiled["reverse_state_pass"]["state_dtype"] == "bfloat16"
    assert compiled["reverse_state_pass"]["chunk_decay_terms"] is True
    for name in ("forward_states_pass", "reverse_state_pass"):     # token-major where the forward made the pieces
        assert compiled[name].get("token_major", False) is (token_major and delta_rule)
    assert not [e for e in einsums if e.startswith("bhnkv,bhnkv")]
    assert_gradients_agree(got, want)


def test_scores_from_forward(monkeypatch):
    """``SCORES_FROM_FORWARD`` (CUDA faked, every kernel replaced by its float64 mirror, the state passes
    token-major): ``chunk_pair_pieces`` is compiled with ``scores=False`` and writes no scores, and
    ``chunk_state_gradients`` reads the forward's ``A_qk`` itself, the tensor the state passes read; the
    gradients are those of the scores made again, to the rounding of ``A_qk`` to bf16."""
    from kda.kernels import backward_chunks, backward_states

    read = {}
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=8, per_channel=True)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), True, None, do, dht.float())
    made = prepare_chunks_mirror()

    def prepare_chunks(*a):
        form = made(*a)
        read["A_qk"] = form.A_qk.data_ptr()
        read.setdefault("alive", []).append(form.A_qk)     # held, so that no later tensor takes its address
        return form

    def state_gradients(*a, **kw):
        read["P"] = a[9].data_ptr()
        read.setdefault("alive", []).append(a[9])
        return state_gradients_mirror(*a, **kw)

    compiled = fake_kernels(monkeypatch, {
        backward_states.forward_states_pass: forward_states_mirror(64),
        backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
        backward_chunks.chunk_pair_pieces: pair_pieces_mirror,
        backward_chunks.chunk_state_gradients: state_gradients,
        backward_chunks.chunk_pair_gradients: pair_gradients_mirror}, prepare_chunks)
    later_switches_off(monkeypatch)
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNELS_BY_CHANNEL", "TOKEN_MAJOR_STATES"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "SCORES_FROM_FORWARD", False)
    want = backward.op_gradients(*args)
    assert "scores" not in compiled["chunk_pair_pieces"] and read["P"] != read["A_qk"]
    monkeypatch.setattr(launch, "poison_outputs", True)              # a score left unwritten would show
    monkeypatch.setattr(backward, "SCORES_FROM_FORWARD", True)
    got = backward.op_gradients(*args)
    assert compiled["chunk_pair_pieces"]["scores"] is False and read["P"] == read["A_qk"]
    assert_gradients_agree(got, want)


def recording_prepare_chunks(made):
    """``prepare_chunks_mirror()`` that records in ``made`` whether it was asked for the backward's outputs and,
    if so, where the tensors it returned lie (``A_qk``, ``G``, ``Tinv``, ``KKE``: their data pointers), so that a
    test can tell that a kernel read those very tensors."""
    mirror = prepare_chunks_mirror()

    def prepare_chunks(*a, **kw):
        out = mirror(*a, **kw)
        made["backward_outputs"] = kw.get("backward_outputs", False)
        if made["backward_outputs"]:
            form, G, Tinv, KKE = out
            made.update(A_qk=form.A_qk.data_ptr(), G=G.data_ptr(), Tinv=Tinv.data_ptr(), KKE=KKE.data_ptr())
        return out
    return prepare_chunks


def test_pair_pieces_from_forward(monkeypatch):
    """``PAIR_PIECES_FROM_FORWARD`` (CUDA faked, every kernel replaced by its float64 mirror, the state passes
    token-major): the forward's ``chunk_intra`` is compiled with ``backward_outputs``, ``chunk_pair_pieces``
    neither compiled nor run, and ``chunk_state_gradients`` and ``chunk_pair_gradients`` read the tensors that
    launch wrote (``G``, ``T``, ``stril(K K^T E)`` and the scores ``A_qk``); the gradients are those of the pieces
    made again, to the rounding of ``T`` and the scores to bf16."""
    from kda.kernels import backward_chunks, backward_states

    made, read = {}, {}
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=8, per_channel=True)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), True, None, do, dht.float())
    prepare_chunks = recording_prepare_chunks(made)

    def state_gradients(*a, **kw):
        read.update(G=a[4].data_ptr(), Tinv=a[8].data_ptr(), A_qk=a[9].data_ptr(), KKE=a[10].data_ptr())
        return state_gradients_mirror(*a, **kw)

    def pair_gradients(*a, **kw):
        read["G of the pairs"] = a[2].data_ptr()
        return pair_gradients_mirror(*a, **kw)

    passes = {backward_states.forward_states_pass: forward_states_mirror(64),
              backward_states.reverse_state_pass: reverse_state_pass_mirror(64)}
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNELS_BY_CHANNEL", "TOKEN_MAJOR_STATES"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "SCORES_FROM_FORWARD", False)
    monkeypatch.setattr(backward, "PAIR_PIECES_FROM_FORWARD", False)
    fake_kernels(monkeypatch, {**passes, backward_chunks.chunk_pair_pieces: pair_pieces_mirror,
                               backward_chunks.chunk_state_gradients: state_gradients_mirror,
                               backward_chunks.chunk_pair_gradients: pair_gradients_mirror}, prepare_chunks)
    want = backward.op_gradients(*args)                 # chunk_pair_pieces (its mirror) makes the pieces
    assert made["backward_outputs"] is False
    compiled = fake_kernels(monkeypatch, {**passes,
                                          backward_chunks.chunk_pair_pieces: lambda *a, **kw: pytest.fail("ran"),
                                          backward_chunks.chunk_state_gradients: state_gradients,
                                          backward_chunks.chunk_pair_gradients: pair_gradients}, prepare_chunks)
    monkeypatch.setattr(launch, "poison_outputs", True)              # a piece left unwritten would show
    monkeypatch.setattr(backward, "PAIR_PIECES_FROM_FORWARD", True)
    got = backward.op_gradients(*args)
    assert made["backward_outputs"] is True and "chunk_pair_pieces" not in compiled
    assert all(read[name] == made[name] for name in ("G", "Tinv", "KKE", "A_qk")), (read, made)
    assert read["G of the pairs"] == made["G"]
    assert_gradients_agree(got, want)


def test_inverse_from_forward(monkeypatch):
    """``INVERSE_FROM_FORWARD`` (CUDA faked, every kernel replaced by its float64 mirror, the state passes
    token-major; GDN): the forward's ``chunk_intra`` is compiled with ``backward_outputs``, the chunk kernel with
    ``pieces_in``, and it reads the ``T``, ``stril(K K^T E)`` and scores that launch wrote; the gradients are
    those of the chunk kernel that makes them again, to the rounding of ``T`` and the scores to bf16."""
    from kda.kernels import backward_chunks, backward_states

    made, read = {}, {}
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=9, per_channel=False)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), True, None, do, dht.float())
    prepare_chunks = recording_prepare_chunks(made)

    def chunk_kernel(*a, **kw):
        if kw.get("pieces_in"):
            read.update(Tinv=a[8].data_ptr(), KKE=a[9].data_ptr(), A_qk=a[10].data_ptr())
        return chunk_kernel_mirror(*a, **kw)

    fakes = {backward_states.forward_states_pass: forward_states_mirror(64),
             backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
             backward_chunks.chunk_gradients: chunk_kernel}
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "TOKEN_MAJOR_STATES"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "INVERSE_FROM_FORWARD", False)
    compiled = fake_kernels(monkeypatch, fakes, prepare_chunks)
    want = backward.op_gradients(*args)
    assert made["backward_outputs"] is False and "pieces_in" not in compiled["chunk_gradients"]
    monkeypatch.setattr(launch, "poison_outputs", True)              # a piece left unwritten would show
    monkeypatch.setattr(backward, "INVERSE_FROM_FORWARD", True)
    got = backward.op_gradients(*args)
    assert made["backward_outputs"] is True and compiled["chunk_gradients"]["pieces_in"] is True
    assert read == {name: made[name] for name in ("Tinv", "KKE", "A_qk")}
    assert_gradients_agree(got, want)


@pytest.mark.parametrize("gate", ["none", "per_head"])
def test_level_pieces_are_the_reference_pieces(gate):
    """``level_pieces`` (levels 1-3, a gate per head or none) gives the reference's pieces, token-major: the
    gated q and k, the scores, ``W = 0``, ``U = v`` and the chunk decays, with a tail chunk."""
    B, T, H, D = 2, 150, 3, 32
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    g = None if gate == "none" else torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 2).double()
    got = backward.level_pieces(q, k, v, g, 0.3, torch.float64)
    p = ref.chunk_pieces(q, k, v, g, None, 0.3, 64)
    for name in ("Qg", "Kd", "P", "U", "W"):
        want = ref.from_chunks(p[name], T)
        assert got[name].shape == want.shape, name
        assert (got[name] - want).abs().max() <= 1e-5 * want.abs().max().clamp(min=1), name
    assert torch.allclose(got["decay"], p["decay"].expand(B, H, p["decay"].shape[2], D).float(), rtol=1e-6)


@pytest.mark.parametrize("gate", ["none", "per_head"])
def test_level_pieces_in_the_backward(gate, monkeypatch):
    """``LEVEL_PIECES`` (CUDA faked, every kernel replaced by its float64 mirror): for levels 1-3 with a gate
    per head or none the state passes read ``level_pieces``' token-major pieces instead of the torch stages'
    chunk copies, and the gradients are those of the torch stages, to the rounding of the pieces to bf16."""
    from kda.kernels import backward_chunks, backward_states

    compiled = fake_kernels(monkeypatch, {
        backward_states.forward_states_pass: forward_states_mirror(64),
        backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
        backward_chunks.chunk_gradients: chunk_kernel_mirror},
        prepare_chunks=lambda *a: pytest.fail("the forward's chunk_intra ran"))
    later_switches_off(monkeypatch)
    q, k, v, g, _, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=9, per_channel=False)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, None if gate == "none" else g.float(), None, 0.5, h0.float(), False, None, do, dht.float())
    for switch in ("STATE_KERNELS", "CHUNK_KERNEL", "TOKEN_MAJOR_STATES"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "LEVEL_PIECES", False)
    want = backward.op_gradients(*args)
    assert compiled["forward_states_pass"].get("token_major", False) is False
    monkeypatch.setattr(backward, "LEVEL_PIECES", True)
    monkeypatch.setattr(backward.stages, "chunk_pieces", lambda *a, **kw: pytest.fail("the torch stages ran"))
    got = backward.op_gradients(*args)
    for name in ("forward_states_pass", "reverse_state_pass"):        # token-major, without the delta rule
        assert compiled[name]["token_major"] is True and compiled[name]["delta_rule"] is False
    assert_gradients_agree(got, want)


@pytest.mark.parametrize("gate", ["none", "per_head"])
def test_level_passes_from_inputs(gate, monkeypatch):
    """``LEVEL_PASSES_FROM_INPUTS`` (CUDA faked, every kernel replaced by its float64 mirror): for levels 1-3 with
    a gate per head or none no pieces are made (neither the torch stages nor ``level_pieces``); the state passes
    are compiled with ``gate_in`` and read the op's ``q, k, v, do`` themselves, as the chunk kernel does; the
    gradients are those of the torch stages, to the rounding of the states to bf16."""
    from kda.kernels import backward_chunks, backward_states

    compiled = fake_kernels(monkeypatch, {
        backward_states.forward_states_pass: forward_states_mirror(64),
        backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
        backward_chunks.chunk_gradients: chunk_kernel_mirror},
        prepare_chunks=lambda *a: pytest.fail("the forward's chunk_intra ran"))
    q, k, v, g, _, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=10, per_channel=False)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, None if gate == "none" else g.float(), None, 0.5, h0.float(), False, None, do, dht.float())
    for switch in ("STATE_KERNELS", "CHUNK_KERNEL", "TOKEN_MAJOR_STATES", "STATES_AS_OPERANDS"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "LEVEL_PASSES_FROM_INPUTS", False)
    want = backward.op_gradients(*args)
    assert "gate_in" not in compiled["forward_states_pass"]
    monkeypatch.setattr(backward, "LEVEL_PASSES_FROM_INPUTS", True)
    monkeypatch.setattr(backward, "LEVEL_PIECES", True)              # taken first: LEVEL_PIECES is not reached
    monkeypatch.setattr(backward.stages, "chunk_pieces", lambda *a, **kw: pytest.fail("the torch stages ran"))
    monkeypatch.setattr(backward, "level_pieces", lambda *a, **kw: pytest.fail("level_pieces ran"))
    monkeypatch.setattr(backward, "to_chunks", lambda *a, **kw: pytest.fail("a chunk copy was made"))
    monkeypatch.setattr(launch, "poison_outputs", True)
    got = backward.op_gradients(*args)
    for name in ("forward_states_pass", "reverse_state_pass"):
        assert compiled[name]["gate_in"] is True and compiled[name]["delta_rule"] is False
    assert compiled["reverse_state_pass"]["chunk_decay_terms"] is True
    assert_gradients_agree(got, want)


@pytest.mark.parametrize("token_major", [False, True], ids=["head_major", "token_major"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_packed_state_kernels(per_channel, token_major, monkeypatch):
    """``PACKED_STATE_KERNELS`` (CUDA faked, every kernel replaced by its float64 mirror): packed sequences (an
    empty one, one of length 1, tails, initial states and final-state gradients per sequence) take the state
    kernels compiled with ``varlen``, one launch each, instead of the torch passes; the gradients are those of the
    torch passes, to the rounding of the states to bf16."""
    compiled = fake_kernels(monkeypatch, every_mirror())
    lengths = [0, 1, 63, 130, 70]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q, k, v, g, beta, h0, do, dht = inputs(B=1, T=sum(lengths), H=2, HQ=2, K=8, V=64, seed=12,
                                           per_channel=per_channel)       # values in a block of 64, as the kernels
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    h0, dht = (torch.randn(len(lengths), *x.shape[1:], dtype=torch.float64) for x in (h0, dht))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), False, cu, do, dht.float())
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", "STATES_AS_OPERANDS"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "TOKEN_MAJOR_STATES", token_major)
    monkeypatch.setattr(backward, "PACKED_STATE_KERNELS", False)
    want = backward.op_gradients(*args)
    assert "forward_states_pass" not in compiled                      # the torch passes
    monkeypatch.setattr(backward, "PACKED_STATE_KERNELS", True)
    monkeypatch.setattr(backward, "torch_state_passes", lambda *a, **kw: pytest.fail("the torch passes ran"))
    monkeypatch.setattr(launch, "poison_outputs", True)
    got = backward.op_gradients(*args)
    for name in ("forward_states_pass", "reverse_state_pass"):
        assert compiled[name]["varlen"] is True and compiled[name].get("token_major", False) is token_major
    assert_gradients_agree(got, want)


def test_the_forward_does_not_import_the_backward():
    """A CUDA-less forward of chunk_kda and chunk_gated_delta_rule (and the package's import) leaves
    ``kda.backward`` unimported, so that the forward's GPU records do not depend on it."""
    import subprocess
    import sys

    code = ("import sys, torch, kda; q = torch.randn(1, 8, 2, 4, dtype=torch.float64); "
            "kda.chunk_kda(q, q, q, -torch.rand(1, 8, 2, 4, dtype=torch.float64), torch.rand(1, 8, 2, dtype=torch.float64), "
            "check_values=False); "
            "kda.chunk_gated_delta_rule(q, q, q, -torch.rand(1, 8, 2, dtype=torch.float64), "
            "torch.rand(1, 8, 2, dtype=torch.float64), check_values=False); print('kda.backward' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("as_operands", [False, True], ids=["float32_states", "states_as_operands"])
@pytest.mark.parametrize("l2norm", [False, True])
def test_op_gradients_with_every_kernel(l2norm, as_operands, monkeypatch):
    """``op_gradients`` for a gate per head with every kernel switch on (CUDA faked), the kernels replaced
    by their float64 stand-ins (the forward's pieces, the two state passes, the chunk stage): the
    gradients of the torch stages, to the rounding of the pieces and states to bf16; and the kernels
    read ``q``, ``k``, ``v`` and ``do`` in bf16 as the op has them (no float32 copy made and rounded back)."""
    from kda.kernels import backward_chunks, backward_states

    seen = {}

    def chunk_kernel(Q, K, V, dO, *rest):
        seen.update(dtypes={x.dtype for x in (Q, K, V, dO)}, V=V.data_ptr(), dO=dO.data_ptr())
        chunk_kernel_mirror(Q, K, V, dO, *rest)

    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=2, K=16, V=64, seed=5, per_channel=False)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))     # keys not unit: the norm has work
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), l2norm, None, do, dht.float())
    want = backward.op_gradients(*args)
    fake_kernels(monkeypatch, {backward_states.forward_states_pass: forward_states_mirror(64),
                               backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
                               backward_chunks.chunk_gradients: chunk_kernel})
    later_switches_off(monkeypatch)
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "STATES_AS_OPERANDS", as_operands)
    monkeypatch.setattr(backward, "TOKEN_MAJOR_STATES", as_operands)      # the two as they went on together
    got = backward.op_gradients(*args)
    assert seen == dict(dtypes={torch.bfloat16}, V=v.data_ptr(), dO=do.data_ptr())      # v and do themselves
    assert_gradients_agree(got, want)


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("l2norm", [False, True])
def test_grads_in_input_dtype(l2norm, per_channel, monkeypatch):
    """``GRADS_IN_INPUT_DTYPE`` (CUDA faked, kernels replaced by their float64 mirrors): the chunk kernel of a
    gate per head is compiled with ``grad_dtype`` the inputs' and writes ``dq, dk, dv`` in it (KDA's
    ``chunk_state_gradients`` its ``dv``), where nothing after it needs float32 (one head of q and k per value
    head, no L2 norm); the gradients are those of the float32 outputs, to their rounding. With the L2 norm the
    outputs stay float32."""
    from kda.kernels import backward_chunks, backward_states

    seen = {}

    def chunk_kernel(*args, **kw):
        seen["out"] = {x.dtype for x in args[9:12]}                    # dQ, dK, dV
        chunk_kernel_mirror(*args)

    def state_gradients(*args, **kw):
        seen["out"] = {args[14].dtype}                                 # dV
        state_gradients_mirror(*args)

    compiled = fake_kernels(monkeypatch, {
        backward_states.forward_states_pass: forward_states_mirror(64),
        backward_states.reverse_state_pass: reverse_state_pass_mirror(64),
        backward_chunks.chunk_gradients: chunk_kernel,
        backward_chunks.chunk_pair_pieces: pair_pieces_mirror,
        backward_chunks.chunk_state_gradients: state_gradients,
        backward_chunks.chunk_pair_gradients: pair_gradients_mirror})
    later_switches_off(monkeypatch)
    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=4, HQ=4, K=16, V=64, seed=7, per_channel=per_channel)
    q, k, v, do = (x.to(torch.bfloat16) for x in (q * 3, k * 2, v, do))
    args = (q, k, v, g.float(), beta.float(), 0.5, h0.float(), l2norm, None, do, dht.float())
    kernel = "chunk_state_gradients" if per_channel else "chunk_gradients"
    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL"):
        monkeypatch.setattr(backward, switch, True)
    want = backward.op_gradients(*args)
    assert seen["out"] == {torch.float32} and "grad_dtype" not in compiled[kernel]
    monkeypatch.setattr(backward, "GRADS_IN_INPUT_DTYPE", True)
    got = backward.op_gradients(*args)
    assert seen["out"] == ({torch.float32} if l2norm else {torch.bfloat16})
    assert compiled[kernel].get("grad_dtype") == (None if l2norm else "bfloat16")
    assert_gradients_agree(got, want)


LEVELS = ["linear", "decay", "gated_scalar", "gated_per_channel", "delta", "delta_l2norm"]


def level_call(level, q, k, v, g, beta, h0, alpha=(0.9, 0.97), final=True):
    """The level 1-4 function of ``level`` on these inputs, with a final state unless ``final=False``."""
    common = dict(scale=0.4, initial_state=h0, output_final_state=final)
    if level == "linear":
        return kda.linear_attention(q, k, v, **common)
    if level == "decay":
        return kda.decay_attention(q, k, v, torch.tensor(alpha, **F64), **common)
    if level.startswith("gated"):
        return kda.gated_attention(q, k, v, g if level.endswith("channel") else g[..., 0], **common)
    # keys of norm 2 in the tests below, past the delta rule's bound on purpose: no value check
    return kda.delta_rule(q, k, v, beta, use_qk_l2norm=level == "delta_l2norm", check_values=False, **common)


@pytest.fixture
def kernels_as_references(monkeypatch):
    """CUDA faked: the levels' kernel runners replaced by their float64 references, which is what the
    kernels compute, so that the public functions take their CUDA route (``LevelGradients``) on CPU tensors."""
    from kda import delta, gated, validate
    from kda.chunking import CHUNK_SIZE as C
    from kda.reference import level1 as ref1, level2 as ref2, level3 as ref3

    def pass_launch(q, k, v, scale, h0, output_final_state, gate, G=None):
        if gate == "none":
            o, ht = ref1.chunked(q * scale, k, v, C, h0, output_final_state)
        else:
            o, ht = ref2.chunked(q * scale, k, v, 2.0 ** G.double(), C, h0, output_final_state)
        return (lambda: None), o, ht

    monkeypatch.setattr(validate, "runs_kernels", lambda where: True)
    monkeypatch.setattr(validate, "KERNEL_DTYPES", validate.CPU_DTYPES)       # float64, to compare exactly
    monkeypatch.setattr(validate, "GATE_DTYPES", validate.CPU_DTYPES)
    monkeypatch.setattr("kda.kernels.linear_pass.pass_launch", pass_launch)
    monkeypatch.setattr(gated, "_run_gated_kernels", lambda q, k, v, g, per_channel, scale, h0, out, check:
                        ref3.chunked(q * scale, k, v, g, C, h0, out))
    monkeypatch.setattr(delta, "_run_kernels", lambda q, k, v, beta, scale, h0, out, check:
                        ref4.chunked(q * scale, k, v, beta, C, h0, out))


@pytest.mark.parametrize("level", LEVELS)
def test_level_gradients_on_cuda_equal_the_cpu_path(level, kernels_as_references, monkeypatch):
    """Levels 1-4 as on CUDA (``kda.cuda_autograd.LevelGradients``: the forward by the kernels, here their
    references; the backward by ``op_gradients``' float32 stages with no gate or no delta rule) against
    autograd through the CPU path: every gradient, the initial state's included, 150 tokens (a tail)."""
    from kda import validate

    q, k, v, g, beta, h0, do, dht = inputs(B=2, T=150, H=2, K=64, V=64, seed=3)   # head sizes the kernels take
    q, k = q * 3, k * 2                                  # keys not unit: the L2 norm has work to do
    takes = {"linear": (), "decay": (), "gated_scalar": ("g",), "gated_per_channel": ("g",)}.get(level, ("beta",))
    named = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    wanted = ["q", "k", "v", *takes, "h0"]

    def grads():
        leaves = {name: x.detach().clone().requires_grad_(name in wanted) for name, x in named.items()}
        o, final = level_call(level, *leaves.values())
        loss = (o * do).sum() + (final * dht).sum()
        return o, torch.autograd.grad(loss, [leaves[name] for name in wanted])

    monkeypatch.setattr(cuda_autograd, "LEVEL_BACKWARD", True)
    o, got = grads()
    assert o.grad_fn is not None and "LevelGradients" in type(o.grad_fn).__name__
    with monkeypatch.context() as m:
        m.setattr(validate, "runs_kernels", lambda where: False)
        _, want = grads()
    for name, a, b in zip(wanted, got, want):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel_l2(a, b) < 2e-5, f"{name}: {rel_l2(a, b):.1e}"      # float32 stages against float64


@pytest.mark.parametrize("level", LEVELS)
def test_level_calls_that_need_gradients_ask_for_the_switch(level, kernels_as_references, monkeypatch):
    """With ``LEVEL_BACKWARD`` off (its default until its GPU tests pass), a CUDA call whose input requires
    grad is refused naming the switch; without gradients (or under no_grad) the call runs as before."""
    q, k, v, g, beta, h0, _, _ = inputs(B=1, T=20, H=2, K=64, V=64)
    monkeypatch.setattr(cuda_autograd, "LEVEL_BACKWARD", False)
    level_call(level, q, k, v, g, beta, h0)
    with pytest.raises(NotImplementedError, match="kda.cuda_autograd.LEVEL_BACKWARD = True"):
        level_call(level, q, k.requires_grad_(), v, g, beta, h0)
    with torch.no_grad():
        o, _ = level_call(level, q, k, v, g, beta, h0)
    assert o.grad_fn is None


@pytest.mark.parametrize("level", ["linear", "delta"])
def test_level_gradients_on_cuda_without_states(level, kernels_as_references, monkeypatch):
    """No initial state and no final state: the output alone, its gradients those of the CPU path."""
    from kda import validate

    q, k, v, g, beta, _, do, _ = inputs(B=1, T=90, H=2, K=64, V=64, seed=4)
    monkeypatch.setattr(cuda_autograd, "LEVEL_BACKWARD", True)

    def grads():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, beta)]
        o = level_call(level, *leaves[:3], g, leaves[3], None, final=False)
        return torch.autograd.grad((o * do).sum(), leaves[:3] + ([leaves[3]] if level == "delta" else []))

    got = grads()
    with monkeypatch.context() as m:
        m.setattr(validate, "runs_kernels", lambda where: False)
        want = grads()
    for a, b in zip(got, want):
        assert rel_l2(a, b) < 2e-5
