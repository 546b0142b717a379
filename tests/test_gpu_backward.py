"""The CUDA backward of chunk_kda and chunk_gated_delta_rule (``kda.backward``, marked ``gpu``):
every gradient of an eager CUDA call against autograd through the float64 token recurrence on the
same (rounded) inputs, bf16 and fp16, tails, packed sequences, gates down to -20, no NaN. The
switch is turned on here, whatever its default. Each test starts from the torch stages (the kernel
switches off) and turns on the kernels it checks; test_gradients_with_every_kernel is the defaults."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import backward as ref

from test_gpu_level5 import GATES, SHAPES, inputs

pytestmark = pytest.mark.gpu

# float32 stages on the rounded inputs, so the bound is the rounding of the gradient's own dtype
BOUND = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 5e-3}
# with the kernels, whose GEMM operands are rounded to bf16 or fp16 (as the forward's state pass does)
KERNEL_BOUND = 2e-2


@pytest.fixture
def device_backward(monkeypatch):
    from kda import cuda_autograd

    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", True)


@pytest.fixture(autouse=True)
def torch_stages(monkeypatch):
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", *LANDED_OFF):
        monkeypatch.setattr(backward, switch, False)


def gradients_on_cuda(fn, leaves, do, dht, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    o, final = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, **kwargs)
    loss = (o.float() * do).sum() + (final * dht).sum()
    return torch.autograd.grad(loss, leaves)


def check(got, want, bound=None, label=""):
    """Every gradient on CUDA, finite, and within ``bound`` of the float64 one (``None``: its dtype's
    rounding, ``BOUND``)."""
    for name, a, b in zip("dq dk dv dg dbeta dh0".split(), got, want):
        limit = BOUND[a.dtype] if bound is None else bound
        assert a.is_cuda and torch.isfinite(a).all(), f"{label}{name}: not finite"
        assert rel_l2(a.double().cpu(), b) <= limit, f"{label}{name}: {rel_l2(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_against_token_recurrence(shape, dtype, kind, per_channel, device_backward):
    leaves = inputs(shape, dtype, kind, per_channel, zlib.crc32(repr((shape, kind, "bwd")).encode()))
    B, T, H, DK, DV = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    do = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype).float()   # o's gradient arrives in o's dtype
    dht = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    got = gradients_on_cuda(fn, leaves, do, dht)
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    check(got, ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), DK ** -0.5, h0))


PACKED_KERNELS = ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", "STATES_AS_OPERANDS",
                  "TOKEN_MAJOR_STATES", "PACKED_STATE_KERNELS")


@pytest.mark.parametrize("kernels", [(), ("FORWARD_PIECES", "CHUNK_KERNEL"), PACKED_KERNELS],
                         ids=["torch", "kernels", "packed_state_kernels"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_packed_sequences(per_channel, kernels, device_backward, monkeypatch):
    """An empty sequence, one of length 1 and lengths not a multiple of 64, each with its state; with the
    torch stages, and with the kernels that packed sequences take (the chunk kernel: a gate per head),
    then within the kernels' bound. ``packed_state_kernels``: every kernel, the state passes too, compiled with
    ``varlen`` (``PACKED_STATE_KERNELS``; seen compiled so)."""
    from kda import backward
    from kda.kernels import build

    for switch in kernels:
        monkeypatch.setattr(backward, switch, True)
    compiled, compile_program = {}, build.compile_program
    monkeypatch.setattr(build, "compile_program",
                        lambda fn, *a, **kw: compiled.update({fn.__name__: kw}) or compile_program(fn, *a, **kw))
    lengths = [0, 1, 63, 130, 200]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    T, H, DK, DV = sum(lengths), 2, 64, 128
    q, k, v, g, beta, _ = inputs((1, T, H, DK, DV), torch.bfloat16, "runs_of_-20", per_channel, 17)
    gen = torch.Generator(device="cuda").manual_seed(4)
    h0, dht = (torch.randn(len(lengths), H, DK, DV, generator=gen, device="cuda") for _ in range(2))
    do = torch.randn(1, T, H, DV, generator=gen, device="cuda").bfloat16().float()
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    got = gradients_on_cuda(fn, (q, k, v, g, beta, h0), do, dht, cu_seqlens=cu)
    want = ref.packed_backward(*(x.double().cpu() for x in (q, k, v, g, beta, do)), cu.cpu(),
                               dht.double().cpu(), DK ** -0.5, initial_state=h0.double().cpu())
    check(got, want, KERNEL_BOUND if kernels else None)
    if kernels == PACKED_KERNELS:
        assert compiled["forward_states_pass"].get("varlen") and compiled["reverse_state_pass"].get("varlen")


def test_a_training_step_in_a_layer(device_backward):
    """A model's call (raw gate in the op, beta's sigmoid, L2 norm of q and k) trains: every
    parameter gets a finite gradient, and one step of SGD lowers the loss."""
    torch.manual_seed(0)
    B, T, H, D = 2, 300, 2, 64
    x = torch.randn(B, T, H * D, device="cuda")
    proj = torch.nn.Linear(H * D, 4 * H * D + 2 * H, device="cuda")
    A_log = torch.nn.Parameter(torch.log(torch.empty(H, device="cuda").uniform_(1, 16)))
    dt_bias = torch.nn.Parameter(torch.zeros(H * D, device="cuda"))
    params = [*proj.parameters(), A_log, dt_bias]

    def loss():
        q, k, v, g, b = proj(x).split([H * D, H * D, H * D, H * D, 2 * H], dim=-1)
        shape = (B, T, H, D)
        o, _ = kda.chunk_kda(q.reshape(shape).bfloat16(), k.reshape(shape).bfloat16(), v.reshape(shape).bfloat16(),
                             g.reshape(shape), b[..., :H], A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
        return (o.float() - v.reshape(shape).detach()).pow(2).mean()

    before = loss()
    grads = torch.autograd.grad(before, params)
    assert all(torch.isfinite(gr).all() and gr.abs().sum() > 0 for gr in grads)
    with torch.no_grad():
        for p, gr in zip(params, grads):
            p -= 0.05 * gr
    assert loss() < before


def state_pass_case(dtype, per_channel, seed, grad_seed):
    """Inputs for the state passes (2 x 300 tokens: a tail; 3 heads of 128; runs of -20 in the gate):
    ``h0, do, dht`` and the reference's state pieces ``whole`` (float32, chunk layout) with ``dO``."""
    from kda import backward

    B, T, H, DK, DV = 2, 300, 3, 128, 128
    q, k, v, g, beta, h0 = inputs((B, T, H, DK, DV), dtype, "runs_of_-20", per_channel, seed)
    gen = torch.Generator(device="cuda").manual_seed(grad_seed)
    do, dht = torch.randn(B, T, H, DV, generator=gen, device="cuda"), torch.randn(B, H, DK, DV, generator=gen,
                                                                                    device="cuda")
    p = ref.chunk_pieces(q.float(), k.float(), v.float(), g, beta, DK ** -0.5, 64, torch.float32)
    return h0, do, dht, {name: p[name] for name in backward.STATE_PIECES}, ref.to_chunks(do, 64)


def reference_passes(whole, h0, dO, dht, dtype):
    """The reference's two passes in float64 on the pieces and ``dO`` rounded to ``dtype`` (the decays
    not): ``S``, ``dS``, ``dh0`` and the rounded pieces."""
    rounded = {name: x.to(dtype).double().cpu() for name, x in whole.items()}
    rounded["decay"] = whole["decay"].double().cpu()
    want_S = ref.forward_states(rounded, h0.double().cpu())[0]
    want_dS, want_dh0 = ref.reverse_state_pass(rounded, dO.to(dtype).double().cpu(), dht.double().cpu())
    return want_S, want_dS, want_dh0, rounded


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_state_pass_kernels_against_the_stages(dtype, per_channel, poisoned, monkeypatch):
    """``kda/kernels/backward_states.py`` against the reference's two passes in float64 on the same
    pieces rounded to the kernels' dtype (a tail chunk, runs of -20); outputs poisoned with NaN. The
    operands of fp16 inputs are fp16 (``STATE_KERNELS_DTYPE`` None), of bf16 inputs bf16."""
    from kda import backward

    monkeypatch.setattr(backward, "STATE_KERNELS_DTYPE", dtype if dtype == torch.float32 else None)
    h0, do, dht, whole, dO = state_pass_case(torch.bfloat16, per_channel, 23, 6)
    S, dS, dh0, _ = backward.kernel_state_passes(whole, h0, dO, dht, dtype)
    want_S, want_dS, want_dh0, _ = reference_passes(whole, h0, dO, dht, dtype)
    bound = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 5e-3}[dtype]   # the states rounded per chunk too
    for name, got, want in (("S", S, want_S), ("dS", dS, want_dS), ("dh0", dh0, want_dh0)):
        assert torch.isfinite(got).all(), f"{name}: not finite (unwritten?)"
        assert rel_l2(got.double().cpu(), want) <= bound, f"{name}: {rel_l2(got.double().cpu(), want):.2e}"


def assert_passes_match(dtype, **pairs):
    """Each ``name=(got, want)`` of the state passes finite (an unwritten element would be NaN) and within the
    operands' bound of the float64 ``want``."""
    bound = {torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    for name, (got, want) in pairs.items():
        assert torch.isfinite(got).all(), f"{name}: not finite (unwritten?)"
        assert rel_l2(got.double().cpu(), want) <= bound, f"{name}: {rel_l2(got.double().cpu(), want):.2e}"


@pytest.mark.parametrize("token_major", [False, True], ids=["head_major", "token_major"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_state_passes_as_operands_against_the_stages(per_channel, dtype, token_major, poisoned):
    """The two state-pass kernels compiled to write both states in the operands' dtype, the reverse pass
    with each chunk decay's gate term (``STATES_AS_OPERANDS``), against the reference's passes in float64
    on the same rounded pieces, and the terms against ``decay_k sum_v S dS`` of those passes (a tail chunk,
    runs of -20, two blocks of value columns); outputs poisoned with NaN. ``token_major``: the pieces and ``dO``
    handed ``[B, T, H, *]`` (``TOKEN_MAJOR_STATES``), the tail chunk's rows past ``T`` loaded as zeros."""
    from kda import backward

    h0, do, dht, whole, dO = state_pass_case(dtype, per_channel, 53, 12)
    if token_major:
        handed = {name: (ref.from_chunks(x, do.shape[1]) if name != "decay" else x) for name, x in whole.items()}
        S, dS, dh0, terms = backward.kernel_state_passes(handed, h0, do, dht, dtype, True, token_major=True)
    else:
        S, dS, dh0, terms = backward.kernel_state_passes(whole, h0, dO, dht, dtype, as_operands=True)
    assert S.dtype == dS.dtype == dtype and terms is not None
    want_S, want_dS, want_dh0, rounded = reference_passes(whole, h0, dO, dht, dtype)
    decay = rounded["decay"].expand(*want_S.shape[:4])
    want_terms = torch.einsum("bhnkv,bhnkv->bhnk", want_S, want_dS) * decay
    assert_passes_match(dtype, S=(S, want_S), dS=(dS, want_dS), dh0=(dh0, want_dh0), terms=(terms, want_terms))


# the backward's switches that landed off, with the gates that test each, on top of the defaults (run 100's
# four switches on since their tests here passed: STATES_AS_OPERANDS, TOKEN_MAJOR_STATES, SHARED_PAIR_SUMS,
# GATE_IN_PAIR_KERNEL); the scores from the forward need KDA and the token-major pieces (on by default)
LANDED_OFF = ("SCORES_FROM_FORWARD", "PAIR_KERNEL_TWO_BLOCKS", "PAIR_KERNEL_BY_CHANNELS", "GRADS_IN_INPUT_DTYPE",
              "PAIR_PIECES_FROM_FORWARD", "INVERSE_FROM_FORWARD", "PACKED_STATE_KERNELS", "LEVEL_PASSES_FROM_INPUTS",
              "PAIR_SUMS_BY_PRODUCTS", "PAIR_SUMS_BY_HALVINGS", "WALK_IDENTITIES")
SWITCH_CASES = [(on, per_channel, kind)
                for on, per_channel, kinds in (
                    (("SCORES_FROM_FORWARD",), True, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("PAIR_PIECES_FROM_FORWARD",), True, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("INVERSE_FROM_FORWARD",), False, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("WALK_IDENTITIES",), False, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("WALK_IDENTITIES",), True, ["logsigmoid", "runs_of_-20"]),
                    (("PAIR_SUMS_BY_PRODUCTS",), True, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("PAIR_SUMS_BY_HALVINGS",), True, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("PAIR_KERNEL_TWO_BLOCKS",), True, ["runs_of_-20", "mild"]),
                    (("PAIR_KERNEL_BY_CHANNELS",), True, ["logsigmoid", "runs_of_-20", "mild"]),
                    (("GRADS_IN_INPUT_DTYPE",), False, ["logsigmoid", "runs_of_-20"]),
                    (("GRADS_IN_INPUT_DTYPE",), True, ["logsigmoid"]),
                    (LANDED_OFF, True, ["logsigmoid", "runs_of_-20"]),
                    (LANDED_OFF, False, ["logsigmoid"]))
                for kind in kinds]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("on, per_channel, kind", SWITCH_CASES,
                         ids=["-".join([*(n.lower() for n in on), "kda" if pc else "gdn", kd]) if len(on) == 1 else
                              f"all_landed_off-{'kda' if pc else 'gdn'}-{kd}" for on, pc, kd in SWITCH_CASES])
def test_gradients_with_the_switches_landed_off(on, per_channel, kind, dtype, device_backward, monkeypatch):
    """The op's gradients with every kernel and the switches that landed off (``LANDED_OFF``) on top of the
    defaults, against the float64 recurrence (a tail chunk, initial and final states), within the bound of
    the state-pass kernels' test; each switch's kernel variant seen compiled (the path taken, not the default's)."""
    from kda import backward
    from kda.kernels import build

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", *on):
        monkeypatch.setattr(backward, switch, True)
    if "PAIR_SUMS_BY_PRODUCTS" in on and "PAIR_SUMS_BY_HALVINGS" not in on:   # the halvings (on by default since run
        monkeypatch.setattr(backward, "PAIR_SUMS_BY_HALVINGS", False)          # 119) would take the products' place
    compiled, compile_program = {}, build.compile_program

    def spied(fn, *args, **kw):
        compiled[fn.__name__] = kw
        return compile_program(fn, *args, **kw)

    monkeypatch.setattr(build, "compile_program", spied)
    shape = (2, 200, 3, 128, 128)
    leaves = inputs(shape, dtype, kind, per_channel, zlib.crc32(f"{per_channel}{dtype}{kind}".encode()))
    gen = torch.Generator(device="cuda").manual_seed(13)
    do = torch.randn(2, 200, 3, 128, generator=gen, device="cuda").to(dtype).float()
    dht = torch.randn(2, 3, 128, 128, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    want = ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), 128 ** -0.5, h0)
    check(gradients_on_cuda(fn, leaves, do, dht), want, KERNEL_BOUND)
    pieces, pairs, chunk = (compiled.get(name, {}) for name in ("chunk_pair_pieces", "chunk_pair_gradients",
                                                                "chunk_state_gradients" if per_channel else
                                                                "chunk_gradients"))
    forward = compiled.get("chunk_intra", {})
    taken = {"SCORES_FROM_FORWARD": pieces.get("scores") is False or "PAIR_PIECES_FROM_FORWARD" in on,
             "PAIR_PIECES_FROM_FORWARD": forward.get("backward_outputs") is True and "chunk_pair_pieces" not in compiled,
             "INVERSE_FROM_FORWARD": forward.get("backward_outputs") is True and chunk.get("pieces_in") is True,
             # the halvings take the place of the products where both are on
             "PAIR_SUMS_BY_PRODUCTS": pairs.get("products") is True or "PAIR_SUMS_BY_HALVINGS" in on,
             "PAIR_SUMS_BY_HALVINGS": pairs.get("halve_to") == backward.PAIR_HALVINGS_TO,
             # the channels' arrangement (min_blocks 4) takes the place of two blocks where both are on
             "PAIR_KERNEL_TWO_BLOCKS": pairs.get("min_blocks") == 2 or "PAIR_KERNEL_BY_CHANNELS" in on,
             "PAIR_KERNEL_BY_CHANNELS": pairs.get("block_dk") == backward.PAIR_KERNEL_CHANNELS["block_dk"],
             "GRADS_IN_INPUT_DTYPE": chunk.get("grad_dtype") == str(dtype).removeprefix("torch."),
             "WALK_IDENTITIES": chunk.get("identities") is True}
    for_op = ({"GRADS_IN_INPUT_DTYPE", "INVERSE_FROM_FORWARD", "WALK_IDENTITIES"} if not per_channel
              else set(taken) - {"INVERSE_FROM_FORWARD"})
    assert all(taken[switch] for switch in on if switch in for_op), taken


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_gradients_with_the_state_pass_kernels(per_channel, device_backward, monkeypatch):
    """The op's gradients with ``STATE_KERNELS`` on (bf16 GEMM operands in the passes) against the
    float64 recurrence, within the forward's bound."""
    from kda import backward

    monkeypatch.setattr(backward, "STATE_KERNELS", True)
    shape = (2, 200, 3, 64, 128)
    leaves = inputs(shape, torch.bfloat16, "logsigmoid", per_channel, 29)
    gen = torch.Generator(device="cuda").manual_seed(8)
    do = torch.randn(2, 200, 3, 128, generator=gen, device="cuda").bfloat16().float()
    dht = torch.randn(2, 3, 64, 128, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    got = gradients_on_cuda(fn, leaves, do, dht)
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    want = ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), 64 ** -0.5, h0)
    check(got, want, KERNEL_BOUND)


def chunk_stage_case(dtype, kind, per_channel, seed):
    """The chunk stage's inputs on the GPU (2 x 300 tokens: a tail; 3 heads of 128) ``q, k, v, g, beta, do``, the
    states entering the chunks and the gradients of those leaving them rounded to ``dtype`` (float64 on the CPU,
    as the reference made them), and the reference's ``chunk_gradients`` in float64 per token: ``dq`` (scale in),
    ``dk``, ``dv``, ``dg`` (``[B, T, H]`` for a gate per head) and ``dbeta``."""
    B, T, H, DK, DV = 2, 300, 3, 128, 128
    q, k, v, g, beta, h0 = inputs((B, T, H, DK, DV), dtype, kind, per_channel, seed)
    gen = torch.Generator(device="cuda").manual_seed(9)
    do = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype)
    dht = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    args = [x.double().cpu() for x in (q, k, v, g, beta, do)]
    p = ref.chunk_pieces(*args[:5], DK ** -0.5, 64)
    S = ref.forward_states(p, h0.double().cpu())[0].to(dtype).double()
    dO = ref.to_chunks(args[5], 64)
    dS = ref.reverse_state_pass(p, dO, dht.double().cpu())[0].to(dtype).double()
    wants = ref.chunk_gradients(p, S, dS, dO)
    dg = ref.from_chunks(wants[4], T)
    wants = (ref.from_chunks(wants[0], T) * DK ** -0.5, ref.from_chunks(wants[1], T), ref.from_chunks(wants[2], T),
             dg if per_channel else dg[..., 0], ref.from_chunks(wants[3][..., None], T)[..., 0])
    return q, k, v, g, beta, do, S, dS, wants


@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20", "mild"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_channel", [False, True, "shared_pairs", "gate_in_pair_kernel", "by_channels", "products",
                                         "by_channels_products", "halvings", "halvings_to_1", "halvings_to_16",
                                         "identities", "gdn_identities"],
                         ids=["gdn", "kda", "kda_shared_pairs", "kda_gate_in_pair_kernel", "kda_by_channels",
                              "kda_products", "kda_by_channels_products", "kda_halvings", "kda_halvings_to_1",
                              "kda_halvings_to_16", "kda_identities", "gdn_identities"])
def test_chunk_kernel_against_the_stages(per_channel, dtype, kind, poisoned, monkeypatch):
    """``kda/kernels/backward_chunks.py`` (a gate per head: ``chunk_gradients``; per channel: its three
    kernels) against the reference's ``chunk_gradients`` in float64 on the same inputs and the same
    states and state gradients rounded to the kernels' dtype (a tail chunk); outputs poisoned with NaN.
    The kernels round their GEMM operands (W, V', P, T and the gradients between GEMMs, and what the
    three hand each other) to that dtype, as fla's kernels do. ``kda_shared_pairs``: the three with
    ``SHARED_PAIR_SUMS`` (``chunk_pair_gradients`` compiled with ``shared_pairs``); ``kda_gate_in_pair_kernel``:
    with ``GATE_IN_PAIR_KERNEL`` (the gate's gradient finished in that kernel; mild gates make each chunk
    decay's term count); ``kda_by_channels``: with the defaults and ``PAIR_KERNEL_BY_CHANNELS`` (the pair sums
    split by channels); ``kda_products``: with the defaults and ``PAIR_SUMS_BY_PRODUCTS`` (the pairs inside a
    sub-chunk by running products of the token decays), and split by channels too; ``kda_halvings``: with the
    defaults and ``PAIR_SUMS_BY_HALVINGS`` (the pairs of different blocks of 4 rows by halvings; ``_to_1``: every
    pair, ``_to_16``: blocks of 16); ``kda_identities``, ``gdn_identities``: with the defaults and
    ``WALK_IDENTITIES`` (the reverse walk's identities in the WY form)."""
    from kda import backward

    monkeypatch.setattr(backward, "WALK_IDENTITIES", str(per_channel).endswith("identities"))
    if per_channel == "gdn_identities":
        per_channel = False
    defaults = per_channel in ("by_channels", "products", "by_channels_products", "identities") or \
        str(per_channel).startswith("halv")
    monkeypatch.setattr(backward, "PAIR_SUMS_BY_HALVINGS", str(per_channel).startswith("halvings"))
    monkeypatch.setattr(backward, "PAIR_HALVINGS_TO", {"halvings_to_1": 1, "halvings_to_16": 16}.get(per_channel, 4))
    monkeypatch.setattr(backward, "SHARED_PAIR_SUMS", per_channel == "shared_pairs" or defaults)
    monkeypatch.setattr(backward, "GATE_IN_PAIR_KERNEL", per_channel == "gate_in_pair_kernel" or defaults)
    monkeypatch.setattr(backward, "PAIR_KERNEL_BY_CHANNELS", per_channel in ("by_channels", "by_channels_products")
                        or str(per_channel).startswith("halv"))
    monkeypatch.setattr(backward, "PAIR_SUMS_BY_PRODUCTS", per_channel in ("products", "by_channels_products"))
    per_channel = bool(per_channel)
    q, k, v, g, beta, do, S, dS, wants = chunk_stage_case(dtype, kind, per_channel, 41 if per_channel else 31)
    DK = q.shape[-1]
    stage = backward.kernel_chunk_gradients_by_channel if per_channel else backward.kernel_chunk_gradients
    gots = stage(q, k, v, g, beta, do, S.cuda(), dS.cuda(), DK ** -0.5, dtype)
    bound = {torch.bfloat16: 2e-2, torch.float16: 1e-2}[dtype]
    for name, got, want in zip("dq dk dv dg dbeta".split(), gots, wants):
        assert torch.isfinite(got).all(), f"{name}: not finite (unwritten?)"
        assert rel_l2(got.double().cpu(), want) <= bound, f"{name}: {rel_l2(got.double().cpu(), want):.2e}"


@pytest.mark.parametrize("identities", [False, True], ids=["", "identities"])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20", "mild"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunk_kernel_with_the_forwards_inverse(dtype, kind, identities, poisoned, monkeypatch):
    """GDN's chunk kernel compiled with ``pieces_in`` (``INVERSE_FROM_FORWARD``), reading ``T``, ``stril(K K^T E)``
    and the scores from the forward's ``chunk_intra`` (compiled with ``backward_outputs``, on the same inputs),
    against the reference's ``chunk_gradients`` in float64 with the same states and state gradients rounded to
    the kernel's dtype (a tail chunk; outputs poisoned with NaN), within the bound of the kernel that makes
    them itself (``test_chunk_kernel_against_the_stages``). ``identities``: the kernel compiled with the reverse
    walk's identities (``WALK_IDENTITIES``)."""
    from kda import backward
    from kda.kernels.chunk_intra import prepare_chunks

    monkeypatch.setattr(backward, "WALK_IDENTITIES", identities)

    q, k, v, g, beta, do, S, dS, wants = chunk_stage_case(dtype, kind, False, 33)
    DK = q.shape[-1]
    form, _, Tinv, KKE = prepare_chunks(q, k, v, g[..., None].contiguous(), beta, DK ** -0.5, backward_outputs=True)
    inverse = {"Tinv": Tinv, "KKE": KKE, "P": form.A_qk}
    gots = backward.kernel_chunk_gradients(q, k, v, g, beta, do, S.cuda(), dS.cuda(), DK ** -0.5, dtype,
                                           inverse=inverse)
    bound = {torch.bfloat16: 2e-2, torch.float16: 1e-2}[dtype]
    for name, got, want in zip("dq dk dv dg dbeta".split(), gots, wants):
        assert torch.isfinite(got).all(), f"{name}: not finite (unwritten?)"
        assert rel_l2(got.double().cpu(), want) <= bound, f"{name}: {rel_l2(got.double().cpu(), want):.2e}"


def pair_pieces_reference(k, g, beta, C=64):
    """What ``chunk_pair_pieces`` writes but the scores, in float64 from the kernel's inputs ``k [B, T, H, DK]``,
    ``g [B, T, H, GD]`` (natural log), ``beta``: ``G [B, H, NC C, GD]`` (log2, flat past the end), ``T`` and
    ``stril(K K^T E)`` per row ``[B, T, H, C]``."""
    B, T, H, DK = k.shape
    NC = -(-T // C)
    pad = lambda x: torch.nn.functional.pad(x.double().cpu(), (0, 0) * (x.dim() - 3) + (0, 0, 0, NC * C - T))
    chunks = lambda x: pad(x).view(B, NC, C, H, *x.shape[3:]).movedim(3, 1)             # [B, H, NC, C, *]
    G = chunks(g).cumsum(-2) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    kc, b = chunks(k), chunks(beta)
    lower = torch.ones(C, C, dtype=torch.bool).tril(-1)[..., None]
    E = torch.where(lower, torch.exp2(torch.clamp(G[..., :, None, :] - G[..., None, :, :], max=0.0)), 0.0)
    KKE = torch.einsum("bhnid,bhnjd,bhnijd->bhnij", kc, kc, E.expand(-1, -1, -1, -1, -1, DK))
    Tinv = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + b[..., None] * KKE)
    rows = lambda x: x.movedim(1, 3).reshape(B, NC * C, H, C)[:, :T]
    return G.reshape(B, H, NC * C, G.shape[-1]), rows(Tinv), rows(KKE)


@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20", "mild"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scalar_gate", [False, True], ids=["kda", "gdn"])
def test_chunk_intra_backward_outputs(scalar_gate, dtype, kind):
    """The forward's ``chunk_intra`` compiled with ``backward_outputs`` (``PAIR_PIECES_FROM_FORWARD``): its
    six forward outputs those of the forward's own compile (``b`` goes on ``A_kk`` after it is written out: the
    same products, in another order for a gate per head), and ``G``, ``T``, ``stril(K K^T E)`` against float64 (a tail chunk; outputs poisoned with
    NaN; the three gate paths of a gate per channel: 16-row sub-chunks, about the middle row, pairwise)."""
    from kda.kernels.chunk_intra import chunk_intra
    from kda.kernels.build import compile_program

    B, T, H, DK, DV = 2, 200, 3, 128, 64
    q, k, v, g, beta, _ = inputs((B, T, H, DK, DV), dtype, kind, not scalar_gate, 57 if scalar_gate else 59)
    gate = g[..., None].contiguous() if scalar_gate else g
    name = str(dtype).removeprefix("torch.")
    NC, C = -(-T // 64), 64
    nan = lambda *size, dt=dtype: torch.full(size, float("nan"), dtype=dt, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    no_chunks = torch.empty(1, 1, dtype=torch.int32, device="cuda")
    runs = []
    for extra in ({}, {"backward_outputs": True}):
        kernel = compile_program(chunk_intra, (), DK=DK, DV=DV, dtype=name, scalar_gate=scalar_gate, **extra)
        outs = [nan(B, T, H, DK), nan(B, T, H, DK), nan(B, H, NC, DK, dt=torch.float32), nan(B, T, H, C),
                nan(B, T, H, DK), nan(B, T, H, DV)]
        more = [nan(B, H, NC * C, gate.shape[-1], dt=torch.float32), nan(B, T, H, C), nan(B, T, H, C, dt=torch.float32)]
        kernel(q, k, v, gate, beta, DK ** -0.5, *outs, flags, no_chunks,
               *(more if extra else [torch.empty(1, 1, 1, 1, device="cuda")]))     # the parked gates' stand-in
        runs.append(outs + (more if extra else []))
    assert flags.tolist() == [0, 0]
    # the same outputs up to a rounding flipped here and there (b applied twice or not at all would be 0.1 or more)
    for label, a, b in zip("Qw Kw decay A_qk W U".split(), runs[1], runs[0]):
        assert torch.isfinite(a).all(), f"{label}: not finite (unwritten?)"
        assert rel_l2(a.double(), b.double()) <= 1e-3, f"{label}: {rel_l2(a.double(), b.double()):.1e}"
    bound = 5e-3 if dtype == torch.bfloat16 else 2e-3
    for label, got, want in zip(("G", "Tinv", "KKE"), runs[1][6:], pair_pieces_reference(k, gate, beta)):
        assert torch.isfinite(got).all(), f"{label}: not finite (unwritten?)"
        limit = 1e-5 if label == "G" else bound
        assert rel_l2(got.double().cpu(), want) <= limit, f"{label}: {rel_l2(got.double().cpu(), want):.2e}"


@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
def test_gradients_with_the_chunk_kernel(per_channel, shape, dtype, kind, device_backward, monkeypatch):
    """chunk_gated_delta_rule's gradients with ``CHUNK_KERNEL`` on, and chunk_kda's with
    ``CHUNK_KERNELS_BY_CHANNEL``, against the float64 recurrence, within the bound of the state-pass
    kernels' test (bf16 GEMM operands)."""
    from kda import backward

    monkeypatch.setattr(backward, "CHUNK_KERNELS_BY_CHANNEL" if per_channel else "CHUNK_KERNEL", True)
    seed = zlib.crc32(repr((shape, kind, "kernels by channel" if per_channel else "chunk kernel")).encode())
    leaves = inputs(shape, dtype, kind, per_channel, seed)
    B, T, H, DK, DV = shape
    gen = torch.Generator(device="cuda").manual_seed(10)
    do = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype).float()
    dht = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    got = gradients_on_cuda(kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule, leaves, do, dht)
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    want = ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), DK ** -0.5, h0)
    check(got, want, KERNEL_BOUND)


@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_gradients_with_every_kernel(per_channel, kind, device_backward, monkeypatch):
    """The op's gradients with ``FORWARD_PIECES``, ``STATE_KERNELS`` and ``CHUNK_KERNEL`` (a gate per
    head) or ``CHUNK_KERNELS_BY_CHANNEL`` on against the float64 recurrence, a tail chunk included, within the bound of the
    state-pass kernels' test; and with ``FORWARD_PIECES`` alone (the torch passes on its pieces)."""
    from kda import backward

    shape = (2, 200, 3, 128, 128)
    leaves = inputs(shape, torch.bfloat16, kind, per_channel, 37)
    gen = torch.Generator(device="cuda").manual_seed(11)
    do = torch.randn(2, 200, 3, 128, generator=gen, device="cuda").bfloat16().float()
    dht = torch.randn(2, 3, 128, 128, generator=gen, device="cuda")
    fn = kda.chunk_kda if per_channel else kda.chunk_gated_delta_rule
    q, k, v, g, beta, h0 = (x.double().cpu() for x in leaves)
    want = ref.recurrence_backward(q, k, v, g, beta, do.double().cpu(), dht.double().cpu(), 128 ** -0.5, h0)
    monkeypatch.setattr(backward, "FORWARD_PIECES", True)
    for switches in ((), ("STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL")):
        for switch in switches:
            monkeypatch.setattr(backward, switch, True)
        check(gradients_on_cuda(fn, leaves, do, dht), want, KERNEL_BOUND, f"{switches}: ")


def test_off_switch_refuses_with_its_name(monkeypatch):
    from kda import cuda_autograd

    monkeypatch.setattr(cuda_autograd, "DEVICE_BACKWARD", False)
    q, k, v, g, beta, _ = inputs((1, 10, 2, 64, 64), torch.bfloat16, "logsigmoid", True, 5)
    q.requires_grad_()
    with pytest.raises(ValueError, match="kda.cuda_autograd.DEVICE_BACKWARD = True"):
        kda.chunk_kda(q, k, v, g, beta)


@pytest.fixture
def level_backward(monkeypatch):
    """``LEVEL_BACKWARD`` on and the backward's kernel switches at their defaults (on), undoing the
    ``torch_stages`` fixture."""
    from kda import backward, cuda_autograd

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(cuda_autograd, "LEVEL_BACKWARD", True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("level", ["linear", "decay", "gated_scalar", "gated_per_channel", "delta"])
def test_level_gradients_against_token_recurrence(level, dtype, level_backward):
    """Levels 1-4 on CUDA with ``LEVEL_BACKWARD`` on and the backward's kernel switches at their defaults:
    every gradient (q, k, v, the gate or beta where the level has one, the initial state) of a call with
    a final state, 300 tokens (a tail), against autograd through the float64 token recurrence on the same
    rounded inputs; the delta rule takes the backward kernels with a zero gate, levels 1-3 the state-pass
    kernels and the chunk kernels compiled without the delta rule."""
    B, T, H, D = 2, 300, 3, 128
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{level}{dtype}".encode()))
    rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, v = rand(B, T, H, D).to(dtype), rand(B, T, H, D).to(dtype)
    k = torch.nn.functional.normalize(rand(B, T, H, D), dim=-1).to(dtype)
    alpha = torch.tensor([0.9, 0.99, 0.999])
    gate = {"decay": alpha.log().cuda().expand(B, T, H).contiguous(),
            "gated_scalar": torch.nn.functional.logsigmoid(rand(B, T, H)),
            "gated_per_channel": torch.nn.functional.logsigmoid(rand(B, T, H, D))}.get(level)
    beta = torch.rand(B, T, H, generator=gen, device="cuda").to(dtype) if level == "delta" else None
    h0, dht, do = rand(B, H, D, D), rand(B, H, D, D), rand(B, T, H, D).to(dtype).float()
    own = {"gated_scalar": gate, "gated_per_channel": gate, "delta": beta}.get(level)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, *([own] if own is not None else []), h0)]
    common = dict(scale=D ** -0.5, initial_state=leaves[-1], output_final_state=True)
    if level == "linear":
        o, final = kda.linear_attention(*leaves[:3], **common)
    elif level == "decay":
        o, final = kda.decay_attention(*leaves[:3], alpha, **common)
    elif level == "delta":
        o, final = kda.delta_rule(*leaves[:4], **common)
    else:
        o, final = kda.gated_attention(*leaves[:4], **common)
    got = torch.autograd.grad((o.float() * do).sum() + (final * dht).sum(), leaves)
    f64 = lambda x: x.double().cpu() if x is not None else None
    want = ref.recurrence_backward(f64(q), f64(k), f64(v), f64(gate), f64(beta), f64(do), f64(dht), D ** -0.5, f64(h0))
    dq, dk, dv, dg, dbeta, dh0 = want
    names = ["dq", "dk", "dv", *(["dg"] if level.startswith("gated") else ["dbeta"] if level == "delta" else []), "dh0"]
    wanted = {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "dbeta": dbeta, "dh0": dh0}
    for name, a in zip(names, got):
        b = wanted[name]
        assert a.is_cuda and torch.isfinite(a).all(), f"{name}: not finite"
        assert rel_l2(a.double().cpu(), b) <= KERNEL_BOUND, f"{name}: {rel_l2(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("level", ["linear", "gated_scalar", "gated_per_channel", "delta"])
def test_level_gradients_with_states_as_operands(level, level_backward, monkeypatch):
    """The level 1-4 gradients, as above in bf16, with ``STATES_AS_OPERANDS`` on too (the chunk kernels without
    the delta rule read the states as the passes wrote them, the gate terms from the reverse pass)."""
    from kda import backward

    monkeypatch.setattr(backward, "STATES_AS_OPERANDS", True)
    test_level_gradients_against_token_recurrence(level, torch.bfloat16, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("level", ["linear", "decay", "gated_scalar"])
def test_level_gradients_with_level_pieces(level, dtype, level_backward, monkeypatch):
    """The level 1-3 gradients (a gate per head or none), as above, with ``LEVEL_PIECES`` on: the state passes
    read ``level_pieces``' token-major pieces in the inputs' dtype instead of the float32 torch stages'."""
    from kda import backward

    made, level_pieces = [], backward.level_pieces
    monkeypatch.setattr(backward, "LEVEL_PIECES", True)
    monkeypatch.setattr(backward, "level_pieces", lambda *a: made.append(1) or level_pieces(*a))
    test_level_gradients_against_token_recurrence(level, dtype, None)
    assert made, "level_pieces did not run"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("level", ["linear", "decay", "gated_scalar"])
def test_level_gradients_with_passes_from_inputs(level, dtype, level_backward, monkeypatch):
    """The level 1-3 gradients (a gate per head or none), as above, with ``LEVEL_PASSES_FROM_INPUTS`` on: no
    pieces; the state passes compiled with ``gate_in`` read the op's inputs and each chunk's cumulative gate."""
    from kda import backward
    from kda.kernels import backward_states

    ran, passes = [], backward_states.run_state_passes_from_inputs
    monkeypatch.setattr(backward, "LEVEL_PASSES_FROM_INPUTS", True)
    monkeypatch.setattr(backward_states, "run_state_passes_from_inputs", lambda *a: ran.append(1) or passes(*a))
    monkeypatch.setattr(backward, "level_pieces", lambda *a: pytest.fail("level_pieces ran"))
    test_level_gradients_against_token_recurrence(level, dtype, None)
    assert ran, "the passes from the inputs did not run"


@pytest.mark.parametrize("gate", ["none", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_state_passes_from_inputs_against_the_stages(dtype, gate, poisoned):
    """The two state-pass kernels compiled with ``gate_in`` (``LEVEL_PASSES_FROM_INPUTS``), reading ``q, k, v,
    do`` and the cumulative gate, against the reference's passes in float64 on the reference's pieces without
    the delta rule, made from the same rounded inputs (the states rounded to the operands' dtype; a tail chunk,
    two blocks of value columns); the decay terms against ``decay sum_v S dS``; outputs poisoned with NaN."""
    from kda.kernels.backward_states import run_state_passes_from_inputs

    B, T, H, DK, DV = 2, 300, 3, 128, 128
    q, k, v, g, _, h0 = inputs((B, T, H, DK, DV), dtype, "runs_of_-20", False, 71)
    g = None if gate == "none" else g
    gen = torch.Generator(device="cuda").manual_seed(17)
    do, dht = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype), torch.randn(B, H, DK, DV,
                                                                                             generator=gen, device="cuda")
    S, dS, dh0, terms = run_state_passes_from_inputs(q, k, v, g, do, h0, dht, DK ** -0.5, True)
    assert S.dtype == dS.dtype == dtype
    f64 = lambda x: x.double().cpu() if x is not None else None
    p = ref.chunk_pieces(f64(q), f64(k), f64(v), f64(g), None, DK ** -0.5, 64)
    want_S = ref.forward_states(p, f64(h0))[0]
    want_dS, want_dh0 = ref.reverse_state_pass(p, ref.to_chunks(f64(do), 64), f64(dht))
    decay = p["decay"].expand(*want_S.shape[:4])
    want_terms = torch.einsum("bhnkv,bhnkv->bhnk", want_S, want_dS) * decay
    assert_passes_match(dtype, S=(S, want_S), dS=(dS, want_dS), dh0=(dh0, want_dh0), terms=(terms, want_terms))


@pytest.mark.parametrize("level", ["linear", "delta_l2norm"])
def test_level_gradients_without_states(level, level_backward):
    """Levels 1 and 4 on CUDA with no initial state and no final state (the delta rule with the L2 norm of
    q and k, in torch before the kernels), bf16, against the float64 recurrence on the normalised inputs."""
    from kda.reference import level4 as ref4

    B, T, H, D = 1, 200, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(level.encode()))
    rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, k, v = (rand(B, T, H, D).bfloat16() for _ in range(3))
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    do = rand(B, T, H, D).bfloat16().float()
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, beta)]
    if level == "linear":
        o = kda.linear_attention(*leaves[:3], scale=D ** -0.5)
        leaves = leaves[:3]
    else:
        o = kda.delta_rule(*leaves, scale=D ** -0.5, use_qk_l2norm=True)
    got = torch.autograd.grad((o.float() * do).sum(), leaves)
    # the reference: autograd through the L2 norm (float64) and the token recurrence's gradients
    q64, k64 = (x.double().cpu().requires_grad_() for x in (q, k))
    qn, kn = (ref4.l2_normalize(x) for x in (q64, k64)) if level != "linear" else (q64, k64)
    beta64 = beta.double().cpu() if level != "linear" else None
    dq, dk, dv, _, dbeta, _ = ref.recurrence_backward(qn.detach(), kn.detach(), v.double().cpu(), None, beta64,
                                                      do.double().cpu(), None, D ** -0.5, None)
    dq, dk = torch.autograd.grad([qn, kn], [q64, k64], [dq, dk])
    for name, a, b in zip(["dq", "dk", "dv", "dbeta"], got, [dq, dk, dv, dbeta]):
        assert a.is_cuda and torch.isfinite(a).all(), f"{name}: not finite"
        assert rel_l2(a.double().cpu(), b) <= KERNEL_BOUND, f"{name}: {rel_l2(a.double().cpu(), b):.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate", ["none", "logsigmoid", "runs_of_-20", "per_channel",
                                  "per_channel_runs_of_-20"])
def test_chunk_kernel_without_the_delta_rule_against_the_stages(gate, dtype, poisoned):
    """The chunk kernels compiled with ``delta_rule=False`` (levels 1-3: ``chunk_gradients`` with no gate or a
    gate per head, the three kernels of a gate per channel) against the reference's ``chunk_gradients`` in
    float64 on the same inputs, states and state gradients rounded to the kernels' dtype, a tail chunk
    included, outputs poisoned with NaN; no ``dbeta``."""
    from kda import backward

    B, T, H, DK, DV = 2, 300, 3, 128, 128
    per_channel = gate.startswith("per_channel")
    kind = "runs_of_-20" if gate.endswith("runs_of_-20") else "logsigmoid"
    q, k, v, g, _, h0 = inputs((B, T, H, DK, DV), dtype, kind, per_channel, 43)
    g = g if gate != "none" else None
    gen = torch.Generator(device="cuda").manual_seed(10)
    do = torch.randn(B, T, H, DV, generator=gen, device="cuda").to(dtype)
    dht = torch.randn(B, H, DK, DV, generator=gen, device="cuda")
    f64 = lambda x: x.double().cpu() if x is not None else None
    p = ref.chunk_pieces(f64(q), f64(k), f64(v), f64(g), None, DK ** -0.5, 64)
    S = ref.forward_states(p, f64(h0))[0].to(dtype).double()
    dO = ref.to_chunks(f64(do), 64)
    dS = ref.reverse_state_pass(p, dO, f64(dht))[0].to(dtype).double()
    wants = ref.chunk_gradients(p, S, dS, dO)
    dg = ref.from_chunks(wants[4], T) if g is not None else None
    wants = [ref.from_chunks(wants[0], T) * DK ** -0.5, ref.from_chunks(wants[1], T), ref.from_chunks(wants[2], T),
             dg if dg is None or per_channel else dg[..., 0]]
    if per_channel:
        gots = backward.kernel_chunk_gradients_by_channel(q, k, v, g, None, do, S.cuda(), dS.cuda(), DK ** -0.5, dtype)
    else:
        gate_in = g if g is not None else torch.zeros(B, T, H, device="cuda")
        gots = backward.kernel_chunk_gradients(q, k, v, gate_in, None, do, S.cuda(), dS.cuda(), DK ** -0.5, dtype)
    assert gots[4] is None
    bound = {torch.bfloat16: 2e-2, torch.float16: 1e-2}[dtype]
    for name, got, want in zip("dq dk dv dg".split(), gots, wants):
        if want is None:
            continue
        assert torch.isfinite(got).all(), f"{name}: not finite (unwritten?)"
        assert rel_l2(got.double().cpu(), want) <= bound, f"{name}: {rel_l2(got.double().cpu(), want):.2e}"
