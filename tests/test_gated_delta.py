"""Level-5 API on the CPU: chunk_kda / chunk_gated_delta_rule against the float64 token recurrence,
variable-length batches, and the argument checks."""

import pytest
import torch

from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.packed import chunk_table
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4

import random_inputs

def inputs(B=1, T=150, H=2, K=16, V=8, seed=0, strength=1.0):
    return random_inputs.gated_delta(B, T, H, K, V, form="uniform", strength=strength, seed=seed)[:5]


@pytest.mark.parametrize("strength", [0.05, 1.0, 20.0])
def test_chunk_kda_matches_recurrence(strength):
    q, k, v, g, beta = inputs(B=2, strength=strength)
    h0 = torch.randn(2, 2, 16, 8, dtype=torch.float64)
    o, ht = chunk_kda(q, k, v, g, beta, scale=0.3, initial_state=h0, output_final_state=True)
    ref_o, ref_ht = ref0.recurrent(q * 0.3, k, v, g, beta, h0, True)
    assert rel_l2(o, ref_o) < 1e-12 and rel_l2(ht, ref_ht) < 1e-6          # states come back in float32
    assert chunk_kda(q, k, v, g, beta)[1] is None


def test_l2norm_in_kernel_and_default_scale():
    q, _, v, g, beta = inputs()
    k = torch.randn_like(q)
    o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    ref_o, _ = ref0.recurrent(ref4.l2_normalize(q) * 16 ** -0.5, ref4.l2_normalize(k), v, g, beta)
    assert rel_l2(o, ref_o) < 1e-12


def test_gdn_is_kda_with_one_gate_per_head():
    q, k, v, _, beta = inputs()
    g = -torch.rand(1, 150, 2, dtype=torch.float64)
    o_gdn, s_gdn = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    o_kda, s_kda = chunk_kda(q, k, v, g[..., None].expand(-1, -1, -1, 16).contiguous(), beta, output_final_state=True)
    assert rel_l2(o_gdn, o_kda) < 1e-13 and rel_l2(s_gdn, s_kda) < 1e-6


def test_varlen_equals_separate_sequences():
    """Packed sequences of uneven lengths (one empty) with their own initial states."""
    q, k, v, g, beta = inputs(T=200)
    bounds = [0, 37, 37, 130, 200]
    h0 = torch.randn(4, 2, 16, 8, dtype=torch.float64)
    o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                      cu_seqlens=torch.tensor(bounds))
    for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
        if e == s:
            assert torch.allclose(ht[n].double(), h0[n], atol=1e-6)
            continue
        ref_o, ref_ht = ref0.recurrent(q[:, s:e] * 16 ** -0.5, k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                       h0[n:n + 1], True)
        assert rel_l2(o[:, s:e], ref_o) < 1e-12 and rel_l2(ht[n:n + 1], ref_ht) < 1e-6


@pytest.mark.parametrize("B,kwargs,match", [
    (2, dict(cu_seqlens=torch.tensor([0, 50, 150])), r"batch size must be 1"),
    (1, dict(cu_seqlens=torch.tensor([0, 50, 149])), r"must start at 0 and end at T = 150"),
    (1, dict(cu_seqlens=torch.tensor([0, 90, 50, 150])), r"non-decreasing"),
    (1, dict(cu_seqlens=torch.tensor([0.0, 150.0])), r"1-D integer tensor"),
    (2, dict(initial_state=torch.zeros(3, 2, 16, 8)), r"initial_state must have shape \[B, H, DK, DV\] = \(2, 2, 16, 8\)"),
    (1, dict(cu_seqlens=torch.tensor([0, 50, 150]), initial_state=torch.zeros(1, 2, 16, 8)),
     r"initial_state must have shape \[B, H, DK, DV\] = \(2, 2, 16, 8\)"),
])
def test_bad_arguments(B, kwargs, match):
    q, k, v, g, beta = inputs(B=B)
    with pytest.raises(ValueError, match=match):
        chunk_kda(q, k, v, g, beta, **kwargs)


def test_gate_form_must_match_the_function():
    q, k, v, g, beta = inputs()
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, H\] \(one gate per head\)"):
        chunk_gated_delta_rule(q, k, v, g, beta)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, H, DK\]"):
        chunk_kda(q, k, v, g[..., 0], beta)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        chunk_kda(q, k, v, g, beta + 1)
    with pytest.raises(ValueError, match=r"finite and <= 0"):
        chunk_kda(q, k, v, -g, beta)


def test_check_values_false_skips_only_the_value_checks():
    """The caller vouches for g and beta: no error on values, still on shapes."""
    q, k, v, g, beta = inputs()
    o, _ = chunk_kda(q, k, v, -g, beta + 1, check_values=False)
    assert o.shape == v.shape
    with pytest.raises(ValueError, match=r"g must have shape"):
        chunk_kda(q, k, v, g[..., 0], beta, check_values=False)


@pytest.mark.parametrize("B,H,DV,expected", [(1, 32, 128, 32), (1, 96, 128, 64), (4, 64, 128, 64), (1, 66, 128, 64),
                                             (1, 65, 128, 32), (2, 96, 64, 64), (1, 96, 64, 32)])
def test_state_pass_columns(B, H, DV, expected):
    """64 value columns per block while B * H * DV / 64 blocks still cover the 132 SMs, else 32."""
    from kda.kernels.gated_state_pass import state_pass_columns

    assert state_pass_columns(B, H, DV, sm_count=132) == expected


def test_chunk_table():
    """Packed sequences in one launch: every chunk of every sequence, the last one of each short,
    none for an empty sequence; each sequence's first chunk by offset."""
    t = chunk_table([0, 70, 71, 71, 271, 400], "cpu")
    assert t.chunks.dtype == torch.int32
    assert t.chunks.tolist() == [[0, 64], [64, 6], [70, 1], [71, 64], [135, 64], [199, 64], [263, 8], [271, 64],
                                 [335, 64], [399, 1]]
    assert t.cu_seqlens.tolist() == [0, 70, 71, 71, 271, 400]
    assert t.chunk_offsets.tolist() == [0, 2, 3, 3, 7, 10]
    assert t.seq_groups.dtype == torch.int32 and t.seq_groups.tolist() == [0, 5]    # all in one window of 32
    assert t.most_chunks == 4
    assert chunk_table([0, 64, 64, 65], "cpu").most_chunks == 1 and chunk_table([0], "cpu").most_chunks == 0
    for n in range(5):                 # the chunks of sequence n tile exactly its tokens
        rows = t.chunks[t.chunk_offsets[n]:t.chunk_offsets[n + 1]].tolist()
        assert sum(length for _, length in rows) == t.cu_seqlens[n + 1] - t.cu_seqlens[n]
        assert all(start == t.cu_seqlens[n] + 64 * i for i, (start, _) in enumerate(rows))


def test_device_chunk_table_is_the_host_table_within_bounds():
    """``device_chunk_table`` (no read-back; a CUDA graph can capture it) on random boundaries, empty sequences and
    one-token ones among them: its first rows are the host table's, the rest repeat the last real chunk (the
    row bound the shapes give is never short), its offsets are the host's and its groups cut the sequences where
    the host's do, with empty groups between them."""
    import random

    from kda import packed

    rng = random.Random(5)
    for trial in range(200):
        N, W = rng.randint(1, 40), rng.choice([1, 3, 32])
        lengths = [rng.choice([0, 1, 63, 64, 65, rng.randint(0, 300)]) for _ in range(N)]
        lengths[0] = lengths[0] or 1
        bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        host = chunk_table(bounds, "cpu")
        dev = packed.device_chunk_table(torch.tensor(bounds), bounds[-1], 64, W)
        NC = host.chunks.shape[0]
        assert dev.chunks.dtype == torch.int32 and dev.chunks.shape[0] >= NC, trial
        assert torch.equal(dev.chunks[:NC], host.chunks) and (dev.chunks[NC:] == host.chunks[-1]).all(), trial
        assert torch.equal(dev.chunk_offsets, host.chunk_offsets) and torch.equal(dev.cu_seqlens, host.cu_seqlens)
        cut = lambda groups: [(a, b) for a, b in zip(groups, groups[1:]) if b > a]
        assert cut(dev.seq_groups.tolist()) == cut(packed.seq_groups(host.chunk_offsets, W).tolist()), trial
        assert dev.seq_groups[0] == 0 and dev.seq_groups[-1] == N
        assert dev.most_chunks is None                 # not read back


@pytest.mark.parametrize("window,expected", [(1, [0, 1, 2, 4, 5]), (3, [0, 2, 4, 5]), (32, [0, 5])])
def test_seq_groups(window, expected):
    """Sequences whose first chunk lies in one window share a group: first chunks 0, 2, 3, 3
    (empty), 7 fall in windows 0, 2, 3, 3, 7 of one chunk, 0, 0, 1, 1, 2 of three. Every group is a
    run of whole sequences, so its chunks are one contiguous range of the table."""
    from kda.packed import seq_groups

    offsets = torch.tensor([0, 2, 3, 3, 7, 10])
    groups = seq_groups(offsets, window)
    assert groups.tolist() == expected
    assert seq_groups(torch.tensor([0]), window).tolist() == [0]                      # no sequence
    first, last = offsets[groups[:-1]], offsets[groups[1:]]
    assert torch.equal(first[1:], last[:-1]) and last[-1] == offsets[-1]


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_grouped_value_heads_read_their_query_head(per_channel):
    """v, g, beta and the states with HV = 3 H heads: value head i reads q, k head i // 3, so the
    result is that of q and k repeated per value head."""
    gen = torch.Generator().manual_seed(3)
    B, T, H, HV, D = 1, 70, 2, 6, 16
    q, k = torch.randn(B, T, H, D, generator=gen), ref4.l2_normalize(torch.randn(B, T, H, D, generator=gen))
    v = torch.randn(B, T, HV, D, generator=gen)
    g = -torch.rand((B, T, HV, D) if per_channel else (B, T, HV), generator=gen)
    beta, h0 = torch.rand(B, T, HV, generator=gen), torch.randn(B, HV, D, D, generator=gen)
    fn = chunk_kda if per_channel else chunk_gated_delta_rule
    o, s = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    q3, k3 = q.repeat_interleave(3, dim=2), k.repeat_interleave(3, dim=2)
    o_ref, s_ref = fn(q3, k3, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)


def test_grouped_value_heads_bad_shapes():
    B, T, H, D = 1, 8, 2, 16
    q = k = torch.randn(B, T, H, D)
    with pytest.raises(ValueError, match="HV a multiple of the H = 2 heads of q"):
        chunk_kda(q, k, torch.randn(B, T, 3, D), -torch.rand(B, T, 3, D), torch.rand(B, T, 3))
    with pytest.raises(ValueError, match="g must"):      # the gate has the value heads
        chunk_kda(q, k, torch.randn(B, T, 4, D), -torch.rand(B, T, 2, D), torch.rand(B, T, 4))
    with pytest.raises(ValueError, match="beta"):
        chunk_kda(q, k, torch.randn(B, T, 4, D), -torch.rand(B, T, 4, D), torch.rand(B, T, 2))
    with pytest.raises(ValueError, match="initial_state"):
        chunk_kda(q, k, torch.randn(B, T, 4, D), -torch.rand(B, T, 4, D), torch.rand(B, T, 4),
                  initial_state=torch.zeros(B, 2, D, D))


def test_host_copy_of_cu_seqlens():
    """``cu_seqlens_cpu`` gives the boundaries without a read-back; it must be a CPU integer
    tensor of the shape of ``cu_seqlens``, and it needs ``cu_seqlens``."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 50, 2, 16, generator=gen)
    k = q / q.norm(dim=-1, keepdim=True)                 # unit keys: within the delta rule's bound
    v, g, beta = torch.randn(1, 50, 2, 16, generator=gen), -torch.rand(1, 50, 2, 16, generator=gen), torch.rand(1, 50, 2)
    cu = torch.tensor([0, 20, 50])
    o, _ = chunk_kda(q, k, v, g, beta, cu_seqlens=cu)
    o_host, _ = chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    assert torch.equal(o, o_host)
    with pytest.raises(ValueError, match="pass cu_seqlens too"):
        chunk_kda(q, k, v, g, beta, cu_seqlens_cpu=cu)
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be an integer CPU tensor"):
        chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 50]))


@pytest.mark.parametrize("norm_kernel", [False, True], ids=["torch", "norm_kernel"])
@pytest.mark.parametrize("fused", [False, True], ids=["torch_norm", "l2norm_in_kernel"])
@pytest.mark.parametrize("scalar_path", [False, True], ids=["level5_path", "scalar_gate_path"])
def test_where_the_l2_norm_is_taken(fused, scalar_path, norm_kernel, monkeypatch):
    """``use_qk_l2norm_in_kernel`` on CUDA (faked): with ``L2NORM_IN_KERNEL`` level 5's ``chunk_intra`` gets the raw
    ``q`` and ``k`` and normalizes them itself (compiled with ``qk_l2norm``), and a gate per head that would take
    the scalar-gate path (whose kernels do not normalize) takes level 5's then; without the switch every path gets
    them normalized by torch first; with ``L2NORM_KERNEL`` the scalar-gate path is kept and the norm's own kernel
    (``l2_normalized``) normalizes them for it."""
    from kda import gated_delta, validate
    from kda.reference import level4 as ref4

    seen = {}
    monkeypatch.setattr(gated_delta, "L2NORM_IN_KERNEL", fused)
    monkeypatch.setattr(gated_delta, "L2NORM_KERNEL", norm_kernel)
    monkeypatch.setattr(validate, "runs_kernels", lambda q: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", scalar_path)
    monkeypatch.setattr(gated_delta, "scalar_gate_columns", lambda *a: 64)
    monkeypatch.setattr("kda.packed.sequence_tables", lambda table, B, device: (B, B, None))
    monkeypatch.setattr("kda.kernels.build.sm_count", lambda device: 132)

    def prepare_chunks(q, k, *rest, **kw):
        seen.update(q=q, k=k, **kw)
        return "form"

    def scalar_gate(q, k, v, *rest):
        seen.update(q=q, k=k, scalar=True)
        return torch.zeros_like(v), None

    monkeypatch.setattr("kda.kernels.chunk_intra.prepare_chunks", prepare_chunks)
    monkeypatch.setattr("kda.kernels.gated_state_pass.state_pass_launch",
                        lambda form, *a: ((lambda: None), torch.zeros(1), None))
    monkeypatch.setattr(gated_delta, "_run_scalar_gate", scalar_gate)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 70, 2, 64, generator=gen).bfloat16() * 3 for _ in range(3))
    g, beta = -torch.rand(1, 70, 2, generator=gen), torch.rand(1, 70, 2, generator=gen)
    gated_delta.forward_eager(q, k, v, g, beta, None, None, False, True, None, False, False)
    scalar = scalar_path and (not fused or norm_kernel)   # not taken with the norm fused but without its kernel
    in_kernel = fused and not scalar
    assert seen.get("qk_l2norm", False) is in_kernel
    assert ("scalar" in seen) is scalar
    for name, x in (("q", q), ("k", k)):
        want = x if in_kernel else ref4.l2_normalize(x.float()).to(x.dtype)
        assert torch.equal(seen[name], want), name


@pytest.mark.parametrize("form", ["softplus", "sigmoid"])
@pytest.mark.parametrize("fused", [False, True], ids=["torch_activations", "activations_in_kernel"])
def test_where_the_activations_are_applied(fused, form, monkeypatch):
    """fla's ``use_gate_in_kernel`` (both forms) and ``use_beta_sigmoid_in_kernel`` for ``chunk_kda`` on CUDA
    (faked): with ``ACTIVATIONS_IN_KERNEL``, ``prepare_chunks`` gets the raw ``g`` and ``beta`` and the
    ``Activation`` to apply; without it, them activated by torch."""
    from kda import gated_delta, validate

    seen = {}
    monkeypatch.setattr(gated_delta, "ACTIVATIONS_IN_KERNEL", fused)
    monkeypatch.setattr(gated_delta, "SPLIT_IN_OP", False)            # the op's own route, not the split's
    monkeypatch.setattr(validate, "runs_kernels", lambda q: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def prepare_chunks(q, k, v, g, beta, *rest, **kw):
        seen.update(g=g, beta=beta, **kw)
        return "form"

    monkeypatch.setattr("kda.kernels.chunk_intra.prepare_chunks", prepare_chunks)
    monkeypatch.setattr("kda.kernels.gated_state_pass.state_pass_launch",
                        lambda form, *a: ((lambda: None), torch.zeros(1), None))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 70, 2, 64, generator=gen).bfloat16() for _ in range(3))
    raw, logits = torch.randn(1, 70, 2, 64, generator=gen), torch.randn(1, 70, 2, generator=gen)
    A_log, dt_bias = torch.randn(2, generator=gen), torch.randn(2 * 64, generator=gen)
    bound = dict(safe_gate=True, lower_bound=-5.0) if form == "sigmoid" else {}
    chunk_kda(q, k, v, raw, logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, check_values=False, **bound)
    assert (seen.get("activation") is not None) is fused
    if fused:
        assert torch.equal(seen["g"], raw) and torch.equal(seen["beta"], logits)
        assert seen["activation"].gate == form and seen["activation"].beta == "sigmoid"
    else:
        x, A = raw + dt_bias.view(2, 64), A_log.exp()[:, None]
        want_g = -A * torch.nn.functional.softplus(x) if form == "softplus" else -5.0 * torch.sigmoid(A * x)
        assert torch.allclose(seen["g"], want_g) and torch.allclose(seen["beta"], torch.sigmoid(logits))


def test_the_value_flags_are_read_once_the_state_pass_is_queued(monkeypatch):
    """``_run_kernels`` launches ``chunk_intra``, makes the state pass ready and launches it, and only
    then runs ``check`` on the flags (``validate.launch_then_check``): the GPU does not wait for the
    host between the kernels, and a bad value still raises from the call."""
    from kda import gated_delta

    calls = []
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)           # level 5's two kernels
    monkeypatch.setattr("kda.kernels.chunk_intra.prepare_chunks",
                        lambda *args, **kw: calls.append("chunk_intra") or "form")
    ready = lambda name: calls.append(f"ready({name})") or ((lambda: calls.append("launch")), "o", None)
    monkeypatch.setattr("kda.kernels.gated_state_pass.state_pass_launch", lambda form, *args: ready(form))
    args = (None,) * 7 + (torch.zeros(2, dtype=torch.int32),)

    assert gated_delta._run_kernels(*args, check=lambda flags: calls.append("read-back")) == ("o", None)
    assert calls == ["chunk_intra", "ready(form)", "launch", "read-back"]

    def bad_values(flags):
        raise ValueError("g must be <= 0")

    calls.clear()
    with pytest.raises(ValueError, match="g must be"):
        gated_delta._run_kernels(*args, check=bad_values)
    assert calls == ["chunk_intra", "ready(form)", "launch"]


def test_the_scalar_gate_path_reads_the_flags_once_its_pass_is_queued(monkeypatch):
    """The same order on the scalar-gate path: ``chunk_gated_inverse``, the pass made ready and
    launched, then the flags."""
    from kda import gated_delta
    from kda.kernels import build

    calls = []
    monkeypatch.setattr(build, "sm_count", lambda device: 132)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr("kda.kernels.scalar_gate.scalar_gate_inverse",
                        lambda *a: calls.append("inverse") or ("G", "Tb"))
    ready = lambda name: calls.append(f"ready({name})") or ((lambda: calls.append("launch")), "o", None)
    monkeypatch.setattr("kda.kernels.scalar_gate.scalar_gate_pass_launch", lambda q, k, v, Tb, G, *a: ready(Tb))
    q, v, g = torch.zeros(1, 64, 2, 64), torch.zeros(1, 64, 2, 64), torch.zeros(1, 64, 2, 1)
    args = (q, q, v, g, None, 0.125, None, torch.zeros(2, dtype=torch.int32))
    assert gated_delta._run_kernels(*args, check=lambda flags: calls.append("read-back")) == ("o", None)
    assert calls == ["inverse", "ready(Tb)", "launch", "read-back"]


def test_the_value_checks_read_both_ranges_back_at_once(monkeypatch):
    """``validate.check_gated_delta_inputs`` (the CPU path and decode) reads the ranges of ``g`` and ``beta`` back
    in one read-back, and each still gets its own error; a float64 gate just above 0 is not rounded away."""
    from kda import validate

    calls = []
    value_ranges = validate.value_ranges
    monkeypatch.setattr(validate, "value_ranges", lambda *t: calls.append(len(t)) or value_ranges(*t))
    q, k, v = (torch.randn(1, 8, 2, 4, dtype=torch.float64) for _ in range(3))
    g, beta = -torch.rand(1, 8, 2, 4, dtype=torch.float64), torch.rand(1, 8, 2, dtype=torch.float64)
    validate.check_gated_delta_inputs(q, k, v, g, beta, None, None, None, True)
    assert calls == [2]
    g[0, 3, 1, 2] = 1e-50
    with pytest.raises(ValueError, match=r"g must be finite and <= 0 .* found 1e-50"):
        validate.check_gated_delta_inputs(q, k, v, g, beta, None, None, None, True)
    beta[0, 5, 0] = 1.5
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        validate.check_gated_delta_inputs(q, k, v, -torch.rand_like(g), beta, None, None, None, True)


def test_the_boundaries_are_read_once_per_tensor_and_version():
    """``validate.read_bounds`` reads a ``cu_seqlens`` tensor's values once (each read of a device
    tensor waits for the GPU, and every layer of a model gets the same tensor); an in-place change
    is a new version and is read again, and another tensor with the same values has its own entry; their order is
    checked with the read (a call that finds them kept does not walk them again), and an unordered read stays
    refused."""
    from kda import validate

    validate._BOUNDS.clear()
    cu = torch.tensor([0, 5, 9])
    assert validate.check_cu_seqlens(cu, 1, 9) == (0, 5, 9)
    assert validate.check_cu_seqlens(cu, 1, 9) == (0, 5, 9) and len(validate._BOUNDS) == 1
    cu[1] = 7                                               # in place: a new version
    assert validate.check_cu_seqlens(cu, 1, 9) == (0, 7, 9)
    with pytest.raises(ValueError, match="non-decreasing"):
        cu[1] = 10
        validate.check_cu_seqlens(cu, 1, 9)
    with pytest.raises(ValueError, match="non-decreasing"):  # kept, and still refused
        validate.check_cu_seqlens(cu, 1, 9)
    assert validate.check_cu_seqlens(cu, 1, 9, read_values=False) is None
    other = torch.tensor([0, 7, 9])
    assert validate.check_cu_seqlens(other, 1, 9) == (0, 7, 9)
    assert sum(kept[0] is other for kept in validate._BOUNDS.values()) == 1
    for n in range(20):                                     # a few tensors are kept, not all
        validate.read_bounds(torch.tensor([0, n]))
    assert len(validate._BOUNDS) == validate._BOUNDS_KEPT


def test_the_chunk_table_is_built_once_per_boundaries():
    """Equal boundaries give the same table (built and copied to the device once); others give
    their own, with every chunk where it should be."""
    from kda import packed

    first = packed.chunk_table([0, 70, 70, 200], "cpu")
    assert packed.chunk_table([0, 70, 70, 200], "cpu") is first
    assert first.chunks.tolist() == [[0, 64], [64, 6], [70, 64], [134, 64], [198, 2]]
    assert first.chunk_offsets.tolist() == [0, 2, 2, 5]
    assert packed.chunk_table([0, 200], "cpu").chunks.tolist() == [[0, 64], [64, 64], [128, 64], [192, 8]]
