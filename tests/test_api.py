"""The public functions: the CPU path, and a clear ValueError for every kind of bad input."""

import math

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level1 as ref1
from kda.reference import level2 as ref2


def qkv(B=2, T=70, H=3, DK=8, DV=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, DK, generator=g).to(dtype) for _ in range(2))
    return q, k, torch.randn(B, T, H, DV, generator=g).to(dtype)


def test_linear_attention_cpu_matches_reference():
    q, k, v = qkv()
    o = kda.linear_attention(q, k, v)
    assert o.shape == (2, 70, 3, 6) and o.dtype == torch.float32
    assert rel_l2(o, ref1.recurrent(q.double() * 8 ** -0.5, k, v)[0]) < 1e-6


def test_decay_attention_cpu_with_states():
    q, k, v = qkv(dtype=torch.bfloat16)
    h0 = torch.randn(2, 3, 8, 6)
    o, ht = kda.decay_attention(q, k, v, torch.tensor([0.5, 0.9, 1.0]), scale=1.0, initial_state=h0,
                                output_final_state=True)
    ref, ref_ht = ref2.recurrent(q, k, v, torch.tensor([0.5, 0.9, 1.0]), h0, True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    assert rel_l2(o, ref) < 5e-3 and rel_l2(ht, ref_ht) < 1e-6


def test_default_scale_is_fla_default():
    q, k, v = qkv()
    assert torch.allclose(kda.linear_attention(q, k, v), kda.linear_attention(q, k, v, scale=8 ** -0.5))


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def test_bad_shapes_and_types():
    q, k, v = qkv()
    raises(r"q must be 4-D", kda.linear_attention, q[0], k, v)
    raises(r"q must be a torch.Tensor", kda.linear_attention, q.numpy(), k, v)
    raises(r"k must have the shape of q", kda.linear_attention, q, k[:, :-1], v)
    raises(r"v must be \[B, T, H, DV\]", kda.linear_attention, q, k, v[:, :, :2])
    raises(r"k must have the dtype of q", kda.linear_attention, q, k.double(), v)
    raises(r"q, k, v must be a floating dtype", kda.linear_attention, q.int(), k.int(), v.int())
    raises(r"no empty dimension", kda.linear_attention, q[:, :0], k[:, :0], v[:, :0])
    raises(r"device of q", kda.linear_attention, q, k.to("meta"), v)


def test_bad_scale_and_state():
    q, k, v = qkv()
    for scale in (0.0, -1.0, math.inf, math.nan, True, "1"):
        raises(r"scale must be a finite positive number", kda.linear_attention, q, k, v, scale=scale)
    raises(r"initial_state must have shape \[B, H, DK, DV\] = \(2, 3, 8, 6\)", kda.linear_attention, q, k, v,
           initial_state=torch.zeros(2, 3, 6, 8))
    raises(r"initial_state must be a tensor", kda.linear_attention, q, k, v, initial_state=[0.0])
    raises(r"initial_state must be a floating tensor", kda.linear_attention, q, k, v,
           initial_state=torch.zeros(2, 3, 8, 6, dtype=torch.int32))


@pytest.mark.parametrize("alpha,match", [
    (0.0, r"alpha must lie in \(0, 1\]"), (1.5, r"alpha must lie in \(0, 1\]"), (-0.2, r"alpha must lie in \(0, 1\]"),
    (math.nan, "alpha must be finite"), (math.inf, "alpha must be finite"), (True, "alpha must be a number"),
    (torch.tensor([0.5, 0.5]), r"alpha must have shape \[H\] = \[3\]"),
    (torch.tensor([0.5, 1.2, 0.5]), r"alpha must lie in \(0, 1\]"),
    (torch.tensor([1, 1, 1]), "alpha must be a number in \\(0, 1\\] or a floating tensor"),
    (torch.full((3, 1), 0.5), "alpha must be a number in \\(0, 1\\] or a floating tensor"),
    ("0.5", "alpha must be a number"),
    (torch.full((3,), 0.5, requires_grad=True), "alpha requires grad, but decay_attention's decays are constants"),
])
def test_bad_alpha(alpha, match):
    q, k, v = qkv()
    raises(match, kda.decay_attention, q, k, v, alpha)


def test_cuda_only_checks_are_documented():
    """Head sizes and dtypes the kernels support are stated where the check lives."""
    from kda import validate

    assert validate.KERNEL_HEAD_SIZES == (64, 128)
    assert validate.KERNEL_DTYPES == (torch.float16, torch.bfloat16)


def test_gated_attention_cpu_both_gate_forms():
    from kda.reference import level3 as ref3

    q, k, v = qkv()
    h0 = torch.randn(2, 3, 8, 6)
    for shape in ((2, 70, 3), (2, 70, 3, 8)):
        g = -torch.rand(shape)
        o, ht = kda.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
        ref_o, ref_ht = ref3.recurrent(q.double() * 8 ** -0.5, k, v, g, h0, True)
        assert o.dtype == q.dtype and ht.dtype == torch.float32
        assert rel_l2(o, ref_o) < 1e-5 and rel_l2(ht, ref_ht) < 1e-5


@pytest.mark.parametrize("g,match", [
    (torch.full((2, 70, 3), 0.1), r"g must be finite and <= 0"),
    (torch.full((2, 70, 3, 8), float("nan")), r"g must be finite and <= 0"),
    (torch.full((2, 70, 3), float("-inf")), r"g must be finite and <= 0"),
    (torch.zeros(2, 70, 4), r"g must have shape \[B, T, H\] = \(2, 70, 3\)"),
    (torch.zeros(2, 70, 3, 7), r"\[B, T, H, DK\] = \(2, 70, 3, 8\)"),
    (torch.zeros(2, 70, 3, dtype=torch.int32), r"g must be one of"),
    ([0.0], r"g must be a tensor"),
])
def test_bad_gates(g, match):
    q, k, v = qkv()
    raises(match, kda.gated_attention, q, k, v, g)


def test_unchecked_gates_skip_only_the_value_check():
    q, k, v = qkv()
    kda.gated_attention(q, k, v, torch.full((2, 70, 3), 0.1), check_values=False)   # no error: the caller's promise
    raises(r"g must have shape", kda.gated_attention, q, k, v, torch.zeros(2, 70, 4), check_values=False)


def test_delta_rule_cpu_matches_recurrence():
    from kda.reference import level4 as ref4

    q, k, v = qkv()
    beta = torch.rand(2, 70, 3)
    h0 = torch.randn(2, 3, 8, 6)
    o, ht = kda.delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True, use_qk_l2norm=True)
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    ref_o, ref_ht = ref4.recurrent(qn * 8 ** -0.5, kn, v, beta, h0, True)
    assert rel_l2(o, ref_o) < 1e-5 and rel_l2(ht, ref_ht) < 1e-5


@pytest.mark.parametrize("beta,match", [
    (torch.full((2, 70, 3), 1.5), r"beta must lie in \[0, 1\]"),
    (torch.full((2, 70, 3), -0.1), r"beta must lie in \[0, 1\]"),
    (torch.full((2, 70, 3), float("nan")), r"beta must lie in \[0, 1\]"),
    (torch.zeros(2, 70), r"beta must have shape \[B, T, H\] = \(2, 70, 3\)"),
    (torch.zeros(2, 70, 3, dtype=torch.int64), r"beta must be a floating tensor"),
    (0.5, r"beta must be a tensor"),
])
def test_bad_beta(beta, match):
    q, k, v = qkv()
    raises(match, kda.delta_rule, q, k, v, beta)


def test_the_value_check_switch_has_one_name():
    """Every public function that checks values on the device takes the same switch."""
    import inspect

    for fn in (kda.gated_attention, kda.delta_rule, kda.chunk_kda, kda.chunk_gated_delta_rule):
        params = inspect.signature(fn).parameters
        assert params["check_values"].default is True, fn.__name__
        assert [p for p in params if p.startswith("check")] == ["check_values"], fn.__name__


@pytest.mark.parametrize("op", ["linear_attention", "decay_attention", "gated_attention", "delta_rule", "chunk_kda",
                                "chunk_gated_delta_rule", "fused_recurrent_kda", "fused_recurrent_gated_delta_rule"])
def test_a_q_that_is_no_tensor_is_named(op):
    """A Python list as q gets the checks' error, not an AttributeError from reading its device."""
    q, k, v = qkv()
    B, T, H, K = q.shape
    g = torch.zeros(B, T, H, *([] if op in ("gated_attention", "chunk_gated_delta_rule",
                                            "fused_recurrent_gated_delta_rule") else [K]))
    extra = {"decay_attention": [0.5], "gated_attention": [g], "delta_rule": [torch.rand(B, T, H)]}.get(
        op, [g, torch.rand(B, T, H)])
    call = getattr(kda, op)
    with pytest.raises(ValueError, match=r"q must be a torch.Tensor of shape \[B, T, H, DK\], got list"):
        if op == "fused_recurrent_gated_delta_rule":          # fla's signature: g, gk, gv, beta
            call(q.tolist(), k, v, g=g, beta=extra[1])
        else:
            call(q.tolist(), k, v, *([] if op == "linear_attention" else extra))


def test_an_integer_q_is_refused_for_its_own_dtype():
    """An int64 q with float32 k is told that q must be floating, not that k must match q's int64."""
    q, k, v = qkv()
    raises(r"q, k, v must be a floating dtype .* got q torch.int64", kda.linear_attention, q.long(), k, v)


def delta_inputs(H=2, HV=2, T=40, DK=8, seed=3):
    """Unit keys and ``beta`` in ``[0, 1]``: within the delta rule's bound ``beta ||k||^2 <= 2``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, DK, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, DK, generator=gen), dim=-1)
    v = torch.randn(1, T, HV, 4, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, DK, generator=gen))
    return q, k, v, g, torch.rand(1, T, HV, generator=gen)


DIVERGING_CALLS = {
    "chunk_kda": lambda q, k, v, g, beta, **kw: kda.chunk_kda(q, k, v, g, beta, **kw),
    "chunk_gated_delta_rule": lambda q, k, v, g, beta, **kw: kda.chunk_gated_delta_rule(q, k, v, g[..., 0], beta, **kw),
    "fused_recurrent_kda": lambda q, k, v, g, beta, **kw: kda.fused_recurrent_kda(q, k, v, g, beta, **kw),
    "delta_rule": lambda q, k, v, g, beta, use_qk_l2norm_in_kernel=False, **kw: kda.delta_rule(
        q, k, v, beta, use_qk_l2norm=use_qk_l2norm_in_kernel, **kw),
}


@pytest.mark.parametrize("name", list(DIVERGING_CALLS))
def test_keys_past_the_delta_rules_bound_raise(name):
    """A key whose ``beta ||k||^2`` exceeds 2 (issue 41: keys x10 gave outputs of 1e28 silently) raises, naming
    ``k``, the value, where, and the option that normalizes the keys; exactly 2 passes; with the option or with
    ``check_values=False`` the call runs."""
    call = DIVERGING_CALLS[name]
    q, k, v, g, beta = delta_inputs()
    beta = torch.ones_like(beta)
    call(q, k * 2 ** 0.5, v, g, beta)                              # beta ||k||^2 = 2 (to rounding): the bound
    call(q, k * 2.03 ** 0.5, v, g, beta)                           # 2.03: past it by rounding's slack only
    k_bad = k.clone()
    k_bad[0, 17, 1] *= 1.5                                         # 2.25 at token 17 of head 1
    with pytest.raises(ValueError, match=r"k: beta \* \|\|k\|\|\^2 = 2\.25 > 2 \(batch 0, token 17, value head 1\)"
                                         r".*use_qk_l2norm_in_kernel=True"):
        call(q, k_bad, v, g, beta)
    o = call(q, k * 10, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
    assert torch.isfinite(o).all()
    call(q, k_bad, v, g, beta, check_values=False)


def test_keys_bound_per_value_head():
    """Grouped value heads: value head ``i`` reads key head ``i // 2``, with its own ``beta``; the bound is checked
    per value head (a large key under a small ``beta`` passes)."""
    q, k, v, g, beta = delta_inputs(H=1, HV=2)
    k = k * 1.8                                                    # ||k||^2 = 3.24
    beta[..., 0], beta[..., 1] = 0.5, 0.6                          # 1.62 on head 0, 1.94 on head 1
    kda.chunk_kda(q, k, v, g, beta)
    beta[0, 5, 1] = 0.7                                            # 2.27 on head 1 at token 5
    with pytest.raises(ValueError, match=r"token 5, value head 1\)"):
        kda.chunk_kda(q, k, v, g, beta)


def test_flagged_keys_raise_the_full_checks_error():
    """The first kernel's third flag (``check_keys``, ``KEY_CHECK_IN_KERNEL``) raises the host check's error, with
    the worst key and where; two flags (a kernel that checks no keys) never do."""
    from kda.validate import raise_flagged_inputs

    q, k, v, g, beta = delta_inputs()
    beta = torch.ones_like(beta)
    k_bad = k.clone()
    k_bad[0, 9, 0] *= 1.5
    raise_flagged_inputs(torch.tensor([0, 0]), g, beta, k_bad)
    raise_flagged_inputs(torch.tensor([0, 0, 0]), g, beta, k_bad)
    with pytest.raises(ValueError, match=r"k: beta \* \|\|k\|\|\^2 = 2\.25 > 2 \(batch 0, token 9, value head 0\)"):
        raise_flagged_inputs(torch.tensor([0, 0, 1]), g, beta, k_bad)
    with pytest.raises(ValueError, match="the kernel found beta"):            # flagged, within the host's slack
        raise_flagged_inputs(torch.tensor([0, 0, 1]), g, beta, k)
