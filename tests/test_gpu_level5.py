"""Level-5 kernels (chunk_kda, chunk_gated_delta_rule) on the GPU against the float64 token
recurrence (marked ``gpu``). The error is fla's: RMS of the difference over RMS of the reference
(the same number as the relative L2 error)."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4

import random_inputs

pytestmark = pytest.mark.gpu

BOUND = 5e-3
SHAPES = [(2, 200, 3, 64, 128), (1, 1, 2, 64, 64), (1, 1000, 2, 128, 64), (1, 129, 2, 128, 128)]
GATES = ["logsigmoid", "kda_style", "uniform_to_-20", "runs_of_-20"]


def inputs(shape, dtype, kind, per_channel, seed):
    B, T, H, DK, DV = shape
    return random_inputs.gated_delta(B, T, H, DK, DV, gate="channel" if per_channel else "head", form=kind,
                                     dtype=torch.float32, cast=dtype, device="cuda", seed=seed)[:6]


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_against_token_recurrence(shape, dtype, kind, per_channel, poisoned):
    q, k, v, g, beta, h0 = inputs(shape, dtype, kind, per_channel, zlib.crc32(repr((shape, kind)).encode()))
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_ht = ref0.recurrent(q.double() * shape[3] ** -0.5, k, v, g, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND, f"o: {rel_l2(o, ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= BOUND, f"final state: {rel_l2(ht, ref_ht):.2e}"


@pytest.mark.parametrize("delta", [True, False, "scalar gate"], ids=["level5", "level3", "level5-scalar-gate"])
@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 129, 2, 128, 64)])
def test_chunk_intra_against_reference_stage(shape, dtype, kind, delta):
    """Every output of ``chunk_intra`` against its float64 stage (``kda.reference.level5.intra``),
    outputs poisoned with NaN, padding rows not compared. The scalar-gate path (GDN) against the
    same stage with its gate broadcast over the key channels."""
    from kda.kernels.chunk_intra import chunk_intra
    from kda.kernels.build import compile_program
    from kda.reference import level5 as ref5
    from kda.reference.common import from_chunks

    B, T, H, DK, DV = shape
    C, NC = 64, -(-shape[1] // 64)
    scalar = delta == "scalar gate"
    q, k, v, g, beta, _ = inputs(shape, dtype, kind, not scalar, seed=zlib.crc32(repr((shape, kind, delta)).encode()))
    scale = DK ** -0.5
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    kernel = compile_program(chunk_intra, (), DK=DK, DV=DV, dtype=name, delta=bool(delta), scalar_gate=scalar)
    g_kernel, g = (g[..., None].contiguous(), g[..., None].expand(*g.shape, DK)) if scalar else (g, g)
    nan = lambda *size, dt=dtype: torch.full(size, float("nan"), dtype=dt, device="cuda")
    Qw, Kw, decay, A_qk, W, U = nan(B, T, H, DK), nan(B, T, H, DK), nan(B, H, NC, DK, dt=torch.float32), \
        nan(B, T, H, C), nan(B, T, H, DK), nan(B, T, H, DV)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    no_chunks = torch.empty(1, 1, dtype=torch.int32, device="cuda")          # dense: the table is a stand-in
    no_kept = torch.empty(1, 1, 1, 1, device="cuda")                           # and the parked gates
    no_starts = torch.empty(1, dtype=torch.int32, device="cuda")                 # and the tiles' sequences
    if delta:
        kernel(q, k, v, g_kernel, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, no_chunks, no_kept, no_starts)
    else:                                             # without the delta rule: V, beta, W, U stand-ins
        rows, beta_rows = torch.empty(1, 1, 1, 1, dtype=dtype, device="cuda"), torch.empty(1, 1, 1, device="cuda")
        kernel(q, k, rows, g_kernel, beta_rows, scale, Qw, Kw, decay, A_qk, rows, rows, flags, no_chunks, no_kept,
               no_starts)
    assert flags.tolist() == [0, 0]
    r_Qw, r_Kw, r_decay, r_A, r_W, r_U = ref5.intra(q, k, v, g, beta, scale, C)
    outputs = [("Qw", Qw, r_Qw), ("Kw", Kw, r_Kw), ("A_qk", A_qk, r_A)] + ([("W", W, r_W), ("U", U, r_U)] if delta else [])
    checks = [(name_, got, from_chunks(ref, T)) for name_, got, ref in outputs] + [("decay", decay, r_decay)]
    bound = 5e-3 if dtype == torch.bfloat16 else 1e-3
    for name_, got, ref in checks:
        assert torch.isfinite(got).all(), name_
        assert rel_l2(got, ref) <= bound, f"{name_}: {rel_l2(got, ref):.2e}"


@pytest.mark.parametrize("block_dv", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 129, 2, 128, 64)])
def test_state_pass_against_reference_stage(shape, dtype, block_dv):
    """``gated_state_output_pass`` alone, both column widths, on ``chunk_intra``'s own output and a
    random initial state, against the same pass in float64; outputs poisoned with NaN, the ragged
    last chunk included."""
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.kernels.build import compile_program
    from kda.kernels.gated_state_pass import gated_state_output_pass
    from kda.reference.common import from_chunks, to_chunks

    B, T, H, DK, DV = shape
    q, k, v, g, beta, h0 = inputs(shape, dtype, "logsigmoid", True, seed=zlib.crc32(repr((shape, block_dv)).encode()))
    form = prepare_chunks(q, k, v, g, beta, DK ** -0.5)
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    kernel = compile_program(gated_state_output_pass, (), DK=DK, DV=DV, chunk_size=64, block_dv=block_dv,
                             dtype=name, initial_state=True, final_state=True)
    o = torch.full((B, T, H, DV), float("nan"), dtype=dtype, device="cuda")
    ht = torch.full((B, H, DK, DV), float("nan"), dtype=torch.float32, device="cuda")
    no_table = torch.empty(1, dtype=torch.int32, device="cuda")           # dense: the packed tables' stand-ins
    kernel(*form, h0, o, ht, no_table, no_table, no_table)
    Qw, Kw, W, U, A = (to_chunks(x.double(), 64) for x in (form.Qw, form.Kw, form.W, form.U, form.A_qk))
    S, out = h0.double(), []
    for c in range(Qw.shape[2]):
        new = U[:, :, c] - W[:, :, c] @ S
        out.append(Qw[:, :, c] @ S + A[:, :, c] @ new)
        S = form.decay[:, :, c, :, None].double() * S + Kw[:, :, c].transpose(-1, -2) @ new
    bound = BOUND if dtype == torch.bfloat16 else 2e-3
    for what, got, ref in (("o", o, from_chunks(torch.stack(out, dim=2), T)), ("final state", ht, S)):
        assert torch.isfinite(got).all(), what
        assert rel_l2(got, ref) <= bound, f"{what}: {rel_l2(got, ref):.2e}"


BAD_VALUES = [("g", 0.5), ("g", float("nan")), ("g", float("-inf")), ("beta", 1.5), ("beta", float("nan")),
              ("beta", -0.1)]


@pytest.mark.parametrize("what,value", BAD_VALUES, ids=[f"{w}={v}" for w, v in BAD_VALUES])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_values_out_of_range_raise(per_channel, what, value):
    """chunk_intra checks g and beta as it reads them; the forward raises the full check's error,
    also for one bad value in the tail chunk of the second of packed sequences."""
    q, k, v, g, beta, _ = inputs((1, 200, 2, 64, 64), torch.bfloat16, "logsigmoid", per_channel, seed=5)
    (g if what == "g" else beta)[0, 190, 1] = value
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    message = "g must be finite and <= 0" if what == "g" else "beta must lie in"
    with pytest.raises(ValueError, match=message):
        fn(q, k, v, g, beta)
    with pytest.raises(ValueError, match=message):
        fn(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 130, 200], device="cuda"))
    fn(q, k, v, g, beta, check_values=False)              # no read-back, no error
    (g if what == "g" else beta)[0, 190, 1] = -0.5 if what == "g" else 0.5
    fn(q, k, v, g, beta)                                    # and a good input passes


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_varlen_with_initial_states(per_channel, poisoned):
    """Uneven packed lengths (one empty), per-sequence initial and final states."""
    lengths = [70, 1, 0, 200, 129]
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, T, 2, 128, 64), torch.bfloat16, "logsigmoid", per_channel, seed=11)
    h0 = torch.randn(len(lengths), 2, 128, 64, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    check_sequences(o, ht, q, k, v, g, beta, h0, lengths)


@pytest.mark.parametrize("window", [1, 4, 32])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_many_short_packed_sequences(per_channel, window, poisoned, monkeypatch):
    """300 sequences of 0 to 64 tokens in one launch per stage, against each sequence run alone
    (the same kernels on the same chunks: the rows past a sequence's end are the next sequence's
    in the packed launch and zeros alone, and must not count). The state pass carries them in
    groups (``seq_groups``) of windows of 1, 4 and 32 chunks: the state must start again at each
    sequence of a group, empty ones included. GDN stays on level 5's kernels here: with windows of 1 or 4 chunks the
    packed launch has enough blocks for the scalar-gate path and one short sequence alone does not (run 147 compared
    the two paths' roundings, 2e-3 apart); ``test_gpu_scalar_gate`` runs the same check on that path."""
    from kda import gated_delta, packed

    monkeypatch.setattr(packed, "GROUP_CHUNKS", window)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", False)
    check_many_short_sequences(kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule, per_channel)


def check_many_short_sequences(fn, per_channel):
    """``fn`` (``chunk_kda`` or ``chunk_gated_delta_rule``) on 300 packed sequences of 0 to 64 tokens against each
    sequence run alone through ``fn``; returns their lengths."""
    gen = torch.Generator().manual_seed(17)
    lengths = torch.randint(0, 65, (300,), generator=gen).tolist()
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, T, 2, 128, 64), torch.bfloat16, "logsigmoid", per_channel, seed=19)
    h0 = torch.randn(len(lengths), 2, 128, 64, device="cuda")
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    bounds = cu.tolist()
    for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
        if e == s:
            assert torch.equal(ht[n], h0[n]), n
            continue
        o_n, ht_n = fn(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], initial_state=h0[n:n + 1],
                       output_final_state=True)
        assert rel_l2(o[:, s:e], o_n) <= 1e-5 and rel_l2(ht[n:n + 1], ht_n) <= 1e-5, n
    return lengths


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_grouped_value_heads(per_channel, packed, poisoned):
    """q, k with 2 heads, v, g, beta and the states with 6: the kernels read query and key head
    i // 3 for value head i, the same arithmetic as q and k repeated per value head; and within
    the bound of the float64 recurrence."""
    q, k, v, g, beta, h0 = inputs((1, 300, 6, 128, 64), torch.bfloat16, "logsigmoid", per_channel, seed=23)
    q, k = q[:, :, ::3].contiguous(), k[:, :, ::3].contiguous()
    cu = torch.tensor([0, 100, 101, 300], device="cuda") if packed else None
    h0 = torch.randn(3 if packed else 1, 6, 128, 64, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    q3, k3 = q.repeat_interleave(3, dim=2), k.repeat_interleave(3, dim=2)
    o3, ht3 = fn(q3, k3, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o, o3) and torch.equal(ht, ht3)
    if not packed:
        ref_o, ref_ht = ref0.recurrent(q3.double() * 128 ** -0.5, k3, v, g, beta, h0, True)
        assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND


def test_beta_zero_and_one(poisoned):
    """b = 0: the state only decays; b = 1: every key's value is written in full. Mild gates:
    under logsigmoid gates 300 steps take the state below float32's range (1e-100)."""
    for b in (0.0, 1.0):
        q, k, v, g, _, h0 = inputs((1, 300, 2, 128, 128), torch.bfloat16, "mild", True, seed=3)
        beta = torch.full((1, 300, 2), b, device="cuda")
        o, ht = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, h0, True)
        assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND


def test_l2norm_in_kernel_and_fla_agreement():
    """use_qk_l2norm_in_kernel on raw keys, and the same inputs through fla's chunk_kda."""
    fla_kda = pytest.importorskip("fla.ops.kda").chunk_kda
    B, T, H, D = 1, 1000, 4, 128
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16() for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    o, _ = kda.chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    ref_o, _ = ref0.recurrent(qn * D ** -0.5, kn, v, g, beta)
    assert rel_l2(o, ref_o) <= BOUND
    o_fla, _ = fla_kda(q, k, v, g, beta.bfloat16(), use_qk_l2norm_in_kernel=True)
    assert rel_l2(o_fla, ref_o) <= 2 * BOUND and rel_l2(o, o_fla.double()) <= 2 * BOUND


@pytest.mark.parametrize("norm_kernel", [False, True], ids=["norm_fused", "norm_kernel"])
def test_gdn_route_with_the_norm(norm_kernel, compiled_kernels, poisoned, monkeypatch):
    """``use_qk_l2norm_in_kernel`` for GDN at a shape that takes the scalar-gate path (64 heads), with
    ``L2NORM_IN_KERNEL``: without the norm's own kernel (``L2NORM_KERNEL``) it takes level 5's path with the norm in
    ``chunk_intra``; with it, it keeps the scalar-gate path, ``q`` and ``k`` normalized by that kernel first; both
    agree with the float64 recurrence on normalized inputs."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "L2NORM_IN_KERNEL", True)
    monkeypatch.setattr(gated_delta, "L2NORM_KERNEL", norm_kernel)
    q, k, v, g, beta, h0 = inputs((1, 300, 64, 128, 128), torch.bfloat16, "logsigmoid", False, 78 if norm_kernel else 77)
    q, k = (q * 3).bfloat16(), (k * 5).bfloat16()
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True)
    if norm_kernel:
        assert "l2_normalize_rows" in compiled_kernels and "chunk_gated_inverse" in compiled_kernels
        assert "chunk_intra" not in compiled_kernels
    else:
        assert compiled_kernels["chunk_intra"].get("qk_l2norm") is True and "chunk_gated_inverse" not in compiled_kernels
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    ref_o, ref_ht = ref0.recurrent(qn * 128 ** -0.5, kn, v, g, beta, h0, True)
    assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND


@pytest.mark.parametrize("steep", ["products", "steep for activated", "middles by rows", "kept", "kept, fast", "capped"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("form", ["softplus", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_activations_in_chunk_intra(dtype, form, packed, steep, compiled_kernels, poisoned, monkeypatch):
    """``ACTIVATIONS_IN_KERNEL``: ``chunk_kda`` as a layer calls it (a raw gate with ``A_log`` and ``dt_bias``, the
    softplus form or the bounded sigmoid one with ``safe_gate``, beta's logits, raw keys with the L2 norm in the op;
    packed: an empty sequence and one token among them), ``chunk_intra`` activating both and normalizing ``q`` and
    ``k`` as it loads them (with ``L2NORM_IN_KERNEL`` and ``PAIRWISE_BY_PRODUCTS``: issue 41's three switches), against
    the float64 recurrence on the inputs activated and normalized in float64; the kernel seen compiled so. ``steep
    for activated``: ``STEEP_FOR_ACTIVATED_GATES`` (bf16: the halvings, with the middles for the sigmoid form; fp16
    keeps the products); ``middles by rows``: and ``MIDDLES_BY_ROWS`` (the sigmoid form's middles by C-row GEMMs);
    ``kept``: those two and ``RELOAD_FROM_KEPT`` (bf16: the steep reload from the parked gate and the kept inverse
    norms); ``kept, fast``: and ``FAST_ACTIVATIONS`` (softplus and the sigmoids by ex2 and lg2), the raw gate in the
    inputs' dtype as a model's projection gives it; ``capped``: those and ``CAPPED_STEPS`` (bf16: every steep chunk's
    diagonal by the capped steps, for both forms)."""
    from kda import gated_delta
    from kda.kernels import chunk_intra

    monkeypatch.setattr(gated_delta, "ACTIVATIONS_IN_KERNEL", True)
    monkeypatch.setattr(chunk_intra, "PAIRWISE_BY_PRODUCTS", True)          # a layer's gates: most chunks steep
    monkeypatch.setattr(chunk_intra, "STEEP_FOR_ACTIVATED_GATES", steep != "products")
    monkeypatch.setattr(chunk_intra, "FAST_ACTIVATIONS_DTYPES", ("bfloat16",))
    monkeypatch.setattr(chunk_intra, "MIDDLES_BY_ROWS", steep in ("middles by rows", "kept", "kept, fast"))
    monkeypatch.setattr(chunk_intra, "RELOAD_FROM_KEPT", steep.startswith("kept") or steep == "capped")
    fast = steep in ("kept, fast", "capped")
    monkeypatch.setattr(chunk_intra, "FAST_ACTIVATIONS", fast)
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS", steep == "capped")
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS_FOR", EVERY_GATE_FORM)       # sigmoid's too
    monkeypatch.setattr(gated_delta, "L2NORM_IN_KERNEL", True)
    B, T, H, D = (1 if packed else 2), 200, 3, 128
    q, k, v, _, _, h0 = inputs((B, T, H, D, D), dtype, "logsigmoid", True, zlib.crc32(f"act{dtype}{form}".encode()))
    q, k = (q * 3).to(dtype), (k * 5).to(dtype)                              # rows far from unit norm
    gen = torch.Generator(device="cuda").manual_seed(21)
    raw = torch.randn(B, T, H, D, generator=gen, device="cuda")
    if fast:                                      # a model's projection gives the raw gate in its dtype
        raw = raw.to(dtype)
    logits = torch.randn(B, T, H, generator=gen, device="cuda")
    A_log = torch.log(torch.empty(H, device="cuda").uniform_(1, 16, generator=gen))
    dt_bias = 0.1 * torch.randn(H * D, generator=gen, device="cuda")
    lengths = [0, 1, 130, 69] if packed else None
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda") \
        if packed else None
    h0 = torch.randn(len(lengths), H, D, D, device="cuda") if packed else h0
    bound = dict(safe_gate=True, lower_bound=-5.0) if form == "sigmoid" else {}
    o, ht = kda.chunk_kda(q, k, v, raw, logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                          use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, initial_state=h0,
                          output_final_state=True, cu_seqlens=cu, **bound)
    intra = compiled_kernels["chunk_intra"]
    assert intra.get("gate_act") == form and intra.get("beta_act") == "sigmoid" and intra.get("qk_l2norm") is True
    capped = steep == "capped" and dtype == torch.bfloat16
    activated = steep not in ("products", "capped") and dtype == torch.bfloat16
    assert intra.get("pairwise") == ("capped" if capped else "halvings" if activated else "products")
    assert bool(intra.get("middles")) == (activated and form == "sigmoid")
    assert bool(intra.get("middles_by_rows")) == (activated and form == "sigmoid" and steep != "steep for activated")
    assert bool(intra.get("keep_loaded")) == ((activated and steep.startswith("kept")) or capped)
    assert bool(intra.get("fast_activations")) == (fast and dtype == torch.bfloat16)
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    x, A = raw.double() + dt_bias.double().view(H, D), A_log.double().exp()[:, None]
    g = -A * torch.nn.functional.softplus(x) if form == "softplus" else -5.0 * torch.sigmoid(A * x)
    beta = torch.sigmoid(logits.double())
    check_sequences(o, ht, qn, kn, v, g, beta, h0, lengths)


def check_sequences(o, ht, q, k, v, g, beta, h0=None, lengths=None):
    """``o`` and the final states ``ht`` of a call against the float64 recurrence on ``q, k, v, g, beta`` (what the
    kernels should have made of the inputs: activated, normalized, query/key heads repeated to the value heads),
    sequence by sequence where ``lengths`` packs them in a batch of one (an empty sequence keeping its initial
    state), else the whole batch; ``h0`` the initial states (None: zero), ``ht`` None where no final state was
    asked for."""
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()] if lengths else [0, q.shape[1]]
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = slice(n, n + 1) if lengths else slice(None)
        start = h0[rows] if h0 is not None else \
            torch.zeros(1 if lengths else q.shape[0], v.shape[2], k.shape[-1], v.shape[-1], device=q.device)
        if e == s:
            assert ht is None or torch.equal(ht[rows], start), f"sequence {n}: an empty sequence keeps its state"
            continue
        piece = lambda x: x[:, s:e]
        ref_o, ref_ht = ref0.recurrent(piece(q).double() * q.shape[-1] ** -0.5, piece(k), piece(v), piece(g),
                                       piece(beta), start, True)
        got = o[:, s:e]
        assert torch.isfinite(got).all(), f"sequence {n}: o not finite"
        assert rel_l2(got, ref_o) <= BOUND, f"sequence {n}, o: {rel_l2(got, ref_o):.2e}"
        if ht is not None:
            assert torch.isfinite(ht[rows]).all(), f"sequence {n}: final state not finite"
            assert rel_l2(ht[rows], ref_ht) <= BOUND, f"sequence {n}, final state: {rel_l2(ht[rows], ref_ht):.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_kernel_is_torchs_norm(dtype, poisoned, monkeypatch):
    """``L2NORM_KERNEL``: ``l2_normalized`` by ``kda.kernels.norms`` against torch's normalization through float32
    (rows far from unit norm, a row count that is not a multiple of the kernel's 64, a zero row), to a rounding
    of the inputs' dtype here and there."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "L2NORM_KERNEL", True)
    gen = torch.Generator(device="cuda").manual_seed(8)
    x = (torch.randn(1, 333, 3, 128, generator=gen, device="cuda") * 7).to(dtype)
    x[0, 5, 1] = 0
    got, want = gated_delta.l2_normalized(x), ref4.l2_normalize(x.float()).to(dtype)
    assert torch.isfinite(got).all() and got.dtype == dtype and got.shape == x.shape
    assert rel_l2(got.double(), want.double()) <= 1e-3 and torch.equal(got[0, 5, 1], x[0, 5, 1])


def layer_gates(shape, gen):
    """Gates as a KDA layer makes them at initialisation: ``-exp(A_log) softplus(x + dt_bias)``, ``A_log = log U(1,
    16)`` per head, ``x`` N(0, 1), ``dt_bias`` 0.1 N(0, 1): several units per token, most chunks steep."""
    B, T, H, D = shape
    A = torch.empty(H, device="cuda").uniform_(1, 16, generator=gen)
    x = torch.randn(shape, generator=gen, device="cuda") + 0.1 * torch.randn(H, D, generator=gen, device="cuda")
    return -A[:, None] * torch.nn.functional.softplus(x)


def safe_layer_gates(shape, gen, lower_bound=-5.0):
    """Gates of fla's ``safe_gate`` form, ``lower_bound sigmoid(exp(A_log) (x + dt_bias))``, ``x`` N(1, 1) so that
    most tokens are near the bound: most 16-row sub-chunks fall by more than 96 in log2 (up to 115), each half by
    at most 57.7."""
    B, T, H, D = shape
    A = torch.empty(H, device="cuda").uniform_(1, 16, generator=gen)
    x = torch.randn(shape, generator=gen, device="cuda") + 1 + 0.1 * torch.randn(H, D, generator=gen, device="cuda")
    return lower_bound * torch.sigmoid(A[:, None] * x)


def steep_gates(kind, shape, seed):
    """Gates of ``kind``: a layer's (``"layer"``), the same with ``safe_gate`` (``"safe_layer"``), or a form of
    ``random_inputs.GATE_FORMS``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind in ("layer", "safe_layer"):
        return (layer_gates if kind == "layer" else safe_layer_gates)(shape, gen)
    return random_inputs.gate_values(kind, shape, gen, "cuda")


def middle_band(g, C=64, BC=16):
    """How many (chunk, sub-chunk, channel) of ``g [B, T, H, D]`` the diagonal about the middles serves
    (``chunk_intra.subchunk_falls``): the gate falls by more than ``DIAGONAL_SPAN_MAX`` over the sub-chunk, by at most
    that over each half of it."""
    from kda.kernels.chunk_intra import subchunk_falls
    from kda.kernels.stages import DIAGONAL_SPAN_MAX, LOG2_E
    from kda.reference.level3 import chunk_gates

    whole, halves = subchunk_falls(chunk_gates(g.double() * LOG2_E, C), BC)
    return int(((whole > DIAGONAL_SPAN_MAX) & (halves <= DIAGONAL_SPAN_MAX)).sum())


STEEP = ["uniform_to_-20", "runs_of_-20", "kda_style", "layer", "safe_layer"]
STEEP_COMPILES = {"products": dict(pairwise="products"), "halvings": dict(pairwise="halvings"),
                  "middles": dict(middles=True), "middles_halvings": dict(middles=True, pairwise="halvings"),
                  "middles_by_rows": dict(middles=True, middles_by_rows=True, pairwise="halvings"),
                  "halvings_kept": dict(pairwise="halvings", keep_loaded=True),
                  "middles_by_rows_kept": dict(middles=True, middles_by_rows=True, pairwise="halvings",
                                               keep_loaded=True),
                  "capped": dict(pairwise="capped", keep_loaded=True)}
# CAPPED_STEPS_FOR's every form of the gate: given activated (None), softplus's, safe_gate's sigmoid
EVERY_GATE_FORM = (None, "softplus", "sigmoid")
STEEP_SWITCHES = {"products": ("PAIRWISE_BY_PRODUCTS",), "halvings": ("PAIRWISE_BY_HALVINGS",),
                  "middles": ("DIAGONAL_ABOUT_MIDDLES",),        # kda.kernels.chunk_intra's, by STEEP_COMPILES' names
                  "halvings_kept": ("PAIRWISE_BY_HALVINGS", "RELOAD_FROM_KEPT"),
                  "capped": ("CAPPED_STEPS", "RELOAD_FROM_KEPT")}


@pytest.mark.parametrize("steep", list(STEEP_COMPILES))
@pytest.mark.parametrize("delta", [True, False], ids=["level5", "level3"])
@pytest.mark.parametrize("kind", STEEP)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunk_intra_steep_chunk_variants(dtype, kind, delta, steep):
    """``chunk_intra`` compiled with ``pairwise="products"`` (``PAIRWISE_BY_PRODUCTS``: a steep chunk's diagonal
    blocks by running products of the token decays), ``"halvings"`` (``PAIRWISE_BY_HALVINGS``: by GEMMs through
    the upper half's last row of blocks of 16, 8, 4 and 2 rows) or ``middles`` (``DIAGONAL_ABOUT_MIDDLES``, bf16:
    one GEMM about each sub-chunk's middle row where its halves allow; alone and with halvings; ``middles_by_rows``,
    ``MIDDLES_BY_ROWS``: that GEMM as two of C rows, with halvings; ``_kept``, ``RELOAD_FROM_KEPT``: the steep reload
    taking the gate back from where the scores parked it) or ``capped`` (``CAPPED_STEPS``, bf16: one GEMM per score
    matrix about the middles, every token's fall capped; fp16's refusal) on steep gates,
    every output against its float64 stage (``kda.reference.level5.intra``) with the bound of the default compile,
    and against the default compile's outputs (the same sums in another order: to 1e-3 for the products, to the
    bound for the GEMMs of rounded operands); outputs poisoned with NaN, a tail chunk. The safe_gate gates put
    sub-chunks in the middles' band (counted on the host)."""
    from kda.kernels.chunk_intra import chunk_intra
    from kda.kernels.build import compile_program
    from kda.reference import level5 as ref5
    from kda.reference.common import from_chunks

    B, T, H, DK, DV = 2, 200, 3, 128, 64
    C, NC = 64, -(-T // 64)
    q, k, v, g, beta, _ = inputs((B, T, H, DK, DV), dtype, "logsigmoid", True, zlib.crc32(f"pp{kind}{delta}".encode()))
    g = steep_gates(kind, (B, T, H, DK), 3 if "layer" in kind else 4)
    if kind == "safe_layer":
        assert middle_band(g) > 0
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    pairwise = STEEP_COMPILES[steep].get("pairwise")
    if name == "float16" and ((delta and pairwise == "halvings") or pairwise == "capped"):
        # the halvings: more shared memory than an SM has (run 108); the capped steps: factors fp16 cannot hold
        with pytest.raises(AssertionError, match="needs bf16"):
            compile_program(chunk_intra, (), DK=DK, DV=DV, dtype=name, delta=delta, **STEEP_COMPILES[steep])
        return
    scale = DK ** -0.5
    nan = lambda *size, dt=dtype: torch.full(size, float("nan"), dtype=dt, device="cuda")
    runs = []
    for variant in ({}, STEEP_COMPILES[steep]):
        kernel = compile_program(chunk_intra, (), DK=DK, DV=DV, dtype=name, delta=delta, **variant)
        outs = [nan(B, T, H, DK), nan(B, T, H, DK), nan(B, H, NC, DK, dt=torch.float32), nan(B, T, H, C),
                nan(B, T, H, DK), nan(B, T, H, DV)]
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        no_chunks = torch.empty(1, 1, dtype=torch.int32, device="cuda")
        # the parked gates (keep_loaded, bf16: poisoned too, where a steep chunk reads back what it did not write)
        kept = nan(B, H, NC * C, DK, dt=torch.float32) if variant.get("keep_loaded") and name == "bfloat16" else \
            torch.empty(1, 1, 1, 1, device="cuda")
        no_starts = torch.empty(1, dtype=torch.int32, device="cuda")
        if delta:
            kernel(q, k, v, g, beta, scale, *outs, flags, no_chunks, kept, no_starts)
        else:                                             # without the delta rule: V, beta, W, U stand-ins
            rows, beta_rows = torch.empty(1, 1, 1, 1, dtype=dtype, device="cuda"), torch.empty(1, 1, 1, device="cuda")
            kernel(q, k, rows, g, beta_rows, scale, outs[0], outs[1], outs[2], outs[3], rows, rows, flags, no_chunks,
                   kept, no_starts)
        assert flags.tolist() == [0, 0]
        runs.append(outs if delta else outs[:4])
    r_Qw, r_Kw, r_decay, r_A, r_W, r_U = ref5.intra(q, k, v, g, beta, scale, C)
    wants = [from_chunks(x, T) for x in (r_Qw, r_Kw)] + [r_decay, from_chunks(r_A, T)] + \
        ([from_chunks(r_W, T), from_chunks(r_U, T)] if delta else [])
    bound = 5e-3 if dtype == torch.bfloat16 else 1e-3
    # against the pairwise sums: the products sum in float32 as they do (1e-3); the halvings and the middles are GEMMs
    # of operands rounded to the inputs' dtype, as the default's mild chunks are, so they get the bound of the default
    near = 1e-3 if steep == "products" else bound
    for label, got, default, want in zip("Qw Kw decay A_qk W U".split(), runs[1], runs[0], wants):
        assert torch.isfinite(got).all(), f"{label}: not finite (unwritten?)"
        assert rel_l2(got, want) <= bound, f"{label}: {rel_l2(got, want):.2e}"
        gap = rel_l2(got.double(), default.double())
        assert gap <= near, f"{label} against exp: {gap:.1e}"


@pytest.mark.parametrize("steep", list(STEEP_SWITCHES))
@pytest.mark.parametrize("op", ["chunk_kda", "gated_attention"])
@pytest.mark.parametrize("kind", ["runs_of_-20", "layer", "safe_layer"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunk_kda_steep_chunk_variants(dtype, kind, op, steep, compiled_kernels, poisoned, monkeypatch):
    """``chunk_kda`` and level 3's ``gated_attention`` with a gate per channel (GLA's form), with
    ``PAIRWISE_BY_PRODUCTS``, ``PAIRWISE_BY_HALVINGS`` (alone and with ``RELOAD_FROM_KEPT``, bf16's reload from the
    parked gate), ``DIAGONAL_ABOUT_MIDDLES`` or ``CAPPED_STEPS`` on steep gates (runs of -20, a layer's initial gates, the same with
    ``safe_gate``), against the float64 recurrence, initial and final states, a tail chunk; the kernel seen compiled
    so."""
    from kda.kernels import chunk_intra
    from kda.reference import level3 as ref3

    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS", False)                    # on by default (for softplus's)
    for switch in STEEP_SWITCHES[steep]:
        monkeypatch.setattr(chunk_intra, switch, True)
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS_FOR", EVERY_GATE_FORM)       # here the gates come activated
    shape = (2, 200, 3, 128, 128)
    q, k, v, g, beta, h0 = inputs(shape, dtype, "runs_of_-20", True, zlib.crc32(f"ppop{dtype}{kind}".encode()))
    if kind != "runs_of_-20":
        g = steep_gates(kind, shape[:3] + (128,), 5)
    if op == "chunk_kda":
        o, ht = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, h0, True)
    else:
        o, ht = kda.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
        ref_o, ref_ht = ref3.recurrent(q.double() * 128 ** -0.5, k, v, g, h0, True)
    expected = dict(STEEP_COMPILES[steep])
    if dtype == torch.float16:                                    # the parked gate: bf16's (fp16 keeps its gate)
        expected.pop("keep_loaded", None)
    if dtype == torch.float16 and (steep == "capped" or (steep.startswith("halvings") and op == "chunk_kda")):
        # bf16 only: the capped steps at both levels, the halvings at level 5
        expected = {"pairwise": None}
    assert all(compiled_kernels["chunk_intra"].get(flag) == value for flag, value in expected.items())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND, f"o: {rel_l2(o, ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= BOUND, f"final state: {rel_l2(ht, ref_ht):.2e}"


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_solve_by_halves(per_channel, dtype, kind, packed, compiled_kernels, poisoned, monkeypatch):
    """``SOLVE_BY_HALVES``: ``chunk_intra``'s inverse with its lower-left half by tf32 GEMMs, for KDA and GDN by
    level 5's path (3 heads), dense (initial and final states, a tail chunk) and packed (an empty sequence, one
    token, ragged tails), against the float64 recurrence; the kernel seen compiled with ``merge="halves"``."""
    from kda import gated_delta
    from kda.kernels import chunk_intra

    monkeypatch.setattr(chunk_intra, "SOLVE_BY_HALVES", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)
    op = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    lengths = [130, 0, 64, 1, 77, 300] if packed else None
    shape = (1 if packed else 2, sum(lengths) if packed else 200, 3, 128, 128)
    q, k, v, g, beta, h0 = inputs(shape, dtype, kind, per_channel, zlib.crc32(f"halves{dtype}{kind}{packed}".encode()))
    if packed:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
        h0 = torch.randn(len(lengths), 3, 128, 128, device="cuda")
        o, ht = op(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    else:
        o, ht = op(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert compiled_kernels["chunk_intra"].get("merge") == "halves"
    check_sequences(o, ht, q, k, v, g, beta, h0, lengths)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_l2norm_fused_in_chunk_intra(per_channel, dtype, kind, packed, compiled_kernels, poisoned, monkeypatch):
    """``L2NORM_IN_KERNEL``: ``use_qk_l2norm_in_kernel`` on raw ``q`` and ``k`` (not unit, a tail chunk; packed:
    an empty sequence and one token among them), ``chunk_intra`` normalizing the rows as it loads them, again
    where a steep chunk loads them a second time (runs of -20; fp16 always), against the float64 recurrence on
    normalized inputs; the kernel seen compiled with ``qk_l2norm`` (level 5's path: 3 heads)."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "L2NORM_IN_KERNEL", True)
    shape = (1 if packed else 2, 200, 3, 128, 128)
    q, k, v, g, beta, h0 = inputs(shape, dtype, kind, per_channel, zlib.crc32(f"l2{per_channel}{dtype}{kind}".encode()))
    q, k = (q * 3).to(dtype), (k * 5).to(dtype)              # rows far from unit norm
    lengths = [0, 1, 130, 69] if packed else None
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda") \
        if packed else None
    h0 = torch.randn(len(lengths), 3, 128, 128, device="cuda") if packed else h0
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
               cu_seqlens=cu)
    assert compiled_kernels["chunk_intra"].get("qk_l2norm") is True
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    check_sequences(o, ht, qn, kn, v, g, beta, h0, lengths)


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_state_flags(packed, initial, final, poisoned):
    """The state pass without an initial state starts from zero without reading one, and without
    ``output_final_state`` writes none: every combination against the float64 recurrence, packed
    with an empty sequence (its final state is its initial one, or zero)."""
    lengths = [130, 0, 64, 1, 77] if packed else [200]
    T = sum(lengths)
    q, k, v, g, beta, _ = inputs((1, T, 2, 128, 64), torch.bfloat16, "logsigmoid", True, seed=29)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    h0 = torch.randn(len(lengths), 2, 128, 64, device="cuda") if initial else None
    o, ht = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=final, cu_seqlens=cu)
    assert (ht is not None) == final
    check_sequences(o, ht, q, k, v, g, beta, h0, lengths if packed else None)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("HV", [2, 4], ids=["heads", "grouped_value_heads"])
@pytest.mark.parametrize("per_channel, scalar_path", [(True, False), (False, False), (False, True)],
                         ids=["kda", "gdn_level5_path", "gdn_scalar_gate_path"])
def test_keys_past_the_bound_raise_in_the_kernel(per_channel, scalar_path, HV, packed, monkeypatch):
    """``KEY_CHECK_IN_KERNEL``: on CUDA, a raw key whose ``beta ||k||^2`` exceeds 2 is flagged by ``chunk_intra`` as
    it loads the keys, and the call raises the host check's error (naming ``k``, the value, where); keys at the bound
    pass, a tail chunk and packed sequences included, and so do keys x10 with ``use_qk_l2norm_in_kernel`` (not
    checked: the kernel normalizes them). GDN on level 5's path and on its scalar-gate path (``chunk_gated_inverse``
    reads ``||k||^2`` off its ``K K^T``), the latter seen taken."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "KEY_CHECK_IN_KERNEL", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", scalar_path)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", scalar_path)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    taken = []
    monkeypatch.setattr(gated_delta, "_run_scalar_gate", lambda *a, run=gated_delta._run_scalar_gate: taken.append(1)
                        or run(*a))
    gen = torch.Generator(device="cuda").manual_seed(HV)
    T, H, D = 200, 2, 128
    q = torch.randn(1, T, H, D, generator=gen, device="cuda").bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, H, D, generator=gen, device="cuda"), dim=-1)
    v = torch.randn(1, T, HV, D, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, *([D] if per_channel else []), generator=gen,
                                                   device="cuda"))
    beta = torch.ones(1, T, HV, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    cu = torch.tensor([0, 70, 71, 200], dtype=torch.int32, device="cuda") if packed else None
    o, _ = fn(q, (k * 1.4).bfloat16(), v, g, beta, cu_seqlens=cu)      # 1.96 (bf16-rounded keys: under 2.04)
    assert torch.isfinite(o).all()
    k_bad = k.clone()
    k_bad[0, 190, 1] *= 1.5                                           # 2.25 at token 190 (the tail) of key head 1
    head = 1 if HV == H else 2
    where = rf"k: beta \* \|\|k\|\|\^2 = 2\.2\d* > 2 \(batch 0, token 190, value head {head}\)"
    with pytest.raises(ValueError, match=where):
        fn(q, k_bad.bfloat16(), v, g, beta, cu_seqlens=cu)
    o, _ = fn(q, (k * 10).bfloat16(), v, g, beta, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert torch.isfinite(o).all()
    assert bool(taken) == scalar_path


@pytest.mark.parametrize("switch, packed", [("WHOLE_STORES", True), ("SWIZZLED_U", False), ("SWIZZLED_U", True)],
                         ids=["whole_stores", "swizzled_u-dense", "swizzled_u-packed"])
def test_kda_pass_forms_same_bits(switch, packed, poisoned, monkeypatch):
    """Forms of ``gated_state_output_pass`` with a ``gated_state_pass`` switch off and on make the same sums:
    ``WHOLE_STORES`` (packed sequences' ``V_new`` masked in registers and stored whole, no barrier in any step),
    ``SWIZZLED_U`` (``U``'s slots swizzled). ``chunk_kda``'s outputs and final states equal bit for bit (packed: an
    empty sequence, one token, ragged tails; initial states, runs of -20), and agree with the recurrence."""
    from kda.kernels import gated_state_pass

    lengths = [130, 0, 64, 1, 77, 300] if packed else [700]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    q, k, v, g, beta, _ = inputs((1, sum(lengths), 4, 128, 128), torch.bfloat16, "runs_of_-20", True, seed=53)
    h0 = torch.randn(len(lengths), 4, 128, 128, device="cuda")
    runs = []
    for on in (False, True):
        monkeypatch.setattr(gated_state_pass, switch, on)
        runs.append(kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    check_sequences(runs[1][0], runs[1][1], q, k, v, g, beta, h0, lengths)


def check_single_chunk_output(module, fn, per_channel, initial, final, dtype, monkeypatch, seeds, grouped=False):
    """``fn`` with ``module.SINGLE_CHUNK_OUTPUT`` on and off on packed sequences of 0 to 64 tokens (empty ones, one
    token, whole chunks, the last one's chunk reaching past T), runs of -20, with and without states (``grouped``:
    2 query/key heads for 4 value heads): the single-chunk kernel is taken when on, not when off; against the
    recurrence per sequence, and within 5e-3 of the pass it replaces. ``seeds``: the lengths' and the inputs'."""
    gen = torch.Generator().manual_seed(seeds[0])
    lengths = [0, 1, 64, 0, 63, 2] + torch.randint(0, 65, (90,), generator=gen).tolist() + [64, 5]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, sum(lengths), 4, 128, 128), dtype, "runs_of_-20", per_channel, seed=seeds[1])
    if grouped:
        q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
    h0 = torch.randn(len(lengths), 4, 128, 128, device="cuda") if initial else None
    runs, taken = [], []
    takes = module.takes_single_chunk_output
    monkeypatch.setattr(module, "takes_single_chunk_output", lambda *a: taken.append(takes(*a)) or taken[-1])
    for single in (True, False):
        monkeypatch.setattr(module, "SINGLE_CHUNK_OUTPUT", single)
        runs.append(fn(q, k, v, g, beta, initial_state=h0, output_final_state=final, cu_seqlens=cu,
                       cu_seqlens_cpu=cu.cpu()))
    assert taken == [True, False] and (runs[0][1] is not None) == final
    heads = (lambda x: x.repeat_interleave(2, dim=2)) if grouped else (lambda x: x)
    check_sequences(runs[0][0], runs[0][1], heads(q), heads(k), v, g, beta, h0, lengths)
    assert rel_l2(runs[0][0], runs[1][0].double()) <= 5e-3
    assert not final or rel_l2(runs[0][1], runs[1][1].double()) <= 5e-3


def check_chain_first_same_bits(module, fn, per_channel, packed, monkeypatch, seed, grouped=False):
    """``fn`` with ``module.CHAIN_FIRST`` 0, 1 and 2, dense and packed (an empty sequence, one token, ragged tails, more
    chunks than two barrier phases), with initial states and runs of -20 (``grouped``: 2 query/key heads for 4 value
    heads): the outputs and final states of 1 and 2 equal 0's bit for bit, and 2's agree with the recurrence; the calls
    return (a deadlocked barrier protocol would hang here)."""
    lengths = [130, 0, 64, 1, 77, 300, 1000] if packed else [1500]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    q, k, v, g, beta, _ = inputs((1, sum(lengths), 4, 128, 128), torch.bfloat16, "runs_of_-20", per_channel, seed=seed)
    if grouped:
        q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
    h0 = torch.randn(len(lengths), 4, 128, 128, device="cuda")
    runs = []
    for chain_first in (0, 1, 2):
        monkeypatch.setattr(module, "CHAIN_FIRST", chain_first)
        runs.append(fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu))
    for o, ht in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(ht, runs[0][1])
    heads = (lambda x: x.repeat_interleave(2, dim=2)) if grouped else (lambda x: x)
    check_sequences(runs[2][0], runs[2][1], heads(q), heads(k), v, g, beta, h0, lengths)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_kda_single_chunk_output(initial, final, dtype, poisoned, monkeypatch):
    """``single_chunk_gated_output`` (``gated_state_pass.SINGLE_CHUNK_OUTPUT``): ``chunk_kda`` as
    ``check_single_chunk_output`` wants it."""
    from kda.kernels import gated_state_pass

    check_single_chunk_output(gated_state_pass, kda.chunk_kda, True, initial, final, dtype, monkeypatch, (61, 67))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_kda_pass_chain_first_same_bits(packed, poisoned, monkeypatch):
    """``gated_state_output_pass(chain_first=1, 2)`` (``gated_state_pass.CHAIN_FIRST``: the output's GEMMs wait for the
    chain's) makes the same products in the same order: ``chunk_kda`` as ``check_chain_first_same_bits`` wants it."""
    from kda.kernels import gated_state_pass

    check_chain_first_same_bits(gated_state_pass, kda.chunk_kda, True, packed, monkeypatch, 73)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn_on_level5"])
@pytest.mark.parametrize("kind", ["logsigmoid", "kda_style", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stream_of_chunks(dtype, kind, per_channel, poisoned, monkeypatch):
    """``gated_delta.STREAM_OF_CHUNKS``: packed sequences of any length with no states through level 5's path as one
    stream of chunks, the state reset where a sequence starts (``chunk_intra`` with ``stream``, the pass over the one
    stream): short ones, ones across two or several chunks, one starting on a chunk's first row, single tokens, empty
    ones, grouped value heads, against the float64 recurrence sequence by sequence (outputs poisoned: every row
    written; runs of -20 make steep chunks); a ``beta`` out of range raises."""
    gen = torch.Generator().manual_seed(101)
    lengths = [64, 1, 0, 63, 65, 200] + torch.randint(0, 90, (120,), generator=gen).tolist() + [1, 0, 130, 1]
    check_packed_without_states("STREAM_OF_CHUNKS", "stream_table", lengths, zlib.crc32(
        f"stream{kind}{dtype}{per_channel}".encode()), dtype, kind, per_channel, monkeypatch)


def check_packed_without_states(switch, table, lengths, seed, dtype, kind, per_channel, monkeypatch):
    """Level 5's path with ``kda.gated_delta``'s ``switch`` on (GDN on level 5's kernels too) over packed sequences of
    ``lengths`` with no states, grouped value heads: the layout ``kda.packed``'s ``table`` builds is taken, the
    outputs match the float64 recurrence sequence by sequence, a ``beta`` out of range raises."""
    from kda import gated_delta, packed

    monkeypatch.setattr(gated_delta, switch, True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, T, 4, 128, 128), dtype, kind, per_channel, seed=seed)
    q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()        # 2 query and key heads for 4 value heads
    taken, build = [], getattr(packed, table)
    monkeypatch.setattr(packed, table, lambda *a: taken.append(1) or build(*a))
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    o, ht = fn(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    assert taken and ht is None
    check_sequences(o, None, q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta,
                    lengths=lengths)
    with pytest.raises(ValueError, match="beta"):
        fn(q, k, v, g, beta + 1, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn_on_level5"])
@pytest.mark.parametrize("kind", ["logsigmoid", "kda_style", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sequence_tiles_per_channel(dtype, kind, per_channel, poisoned, monkeypatch):
    """``gated_delta.TILES_OF_SHORT_SEQUENCES``: packed sequences of 0 to 64 tokens (a single token, empty ones) with no
    states through level 5's path in tiles of whole sequences (``chunk_intra`` with ``tile_sequences``, the pass
    from zero states over the tiles), grouped value heads, against the float64 recurrence sequence by sequence
    (outputs poisoned: every row written; runs of -20 make steep tiles); a ``beta`` out of range raises."""
    gen = torch.Generator().manual_seed(97)
    lengths = torch.randint(0, 65, (150,), generator=gen).tolist() + [1, 0, 64, 1]
    seed = zlib.crc32(f"{kind}{dtype}{per_channel}".encode())
    check_packed_without_states("TILES_OF_SHORT_SEQUENCES", "sequence_tile_table", lengths, seed, dtype, kind,
                                per_channel, monkeypatch)
