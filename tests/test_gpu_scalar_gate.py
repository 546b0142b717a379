"""GDN's scalar-gate path (``kda.kernels.scalar_gate``) on the GPU against the float64 recurrence
(marked ``gpu``). The path is switched on and taken for every shape here (``SCALAR_GATE_MIN_BLOCKS``
0), whatever the switch's default; outputs are poisoned with NaN before each launch."""

import zlib

import pytest
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

from test_gpu_level5 import (BOUND, GATES, SHAPES, check_chain_first_same_bits, check_many_short_sequences,
                             check_sequences, check_single_chunk_output, inputs)

pytestmark = pytest.mark.gpu


@pytest.fixture
def scalar_path(monkeypatch, poisoned):
    from kda import gated_delta

    from kda import distributed

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", True)
    monkeypatch.setattr(distributed, "SCALAR_GATE_SPLIT", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    launches = []
    run = gated_delta._run_scalar_gate
    monkeypatch.setattr(gated_delta, "_run_scalar_gate", lambda *a: launches.append(a[-1]) or run(*a))
    return launches


@pytest.mark.parametrize("columns", [128, 64])
@pytest.mark.parametrize("kind", GATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_against_token_recurrence(shape, dtype, kind, columns, scalar_path, monkeypatch):
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_COLUMNS", columns)
    q, k, v, g, beta, h0 = inputs(shape, dtype, kind, False, zlib.crc32(repr((shape, kind, "sg")).encode()))
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert scalar_path == [min(columns, shape[4])]
    ref_o, ref_ht = ref0.recurrent(q.double() * shape[3] ** -0.5, k, v, g, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND, f"o: {rel_l2(o, ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= BOUND, f"final state: {rel_l2(ht, ref_ht):.2e}"


def reference_inverse(k, g, beta, C=64):
    """``G`` (log2, ``[B, H, NC C]``, flat past the end) and ``Tb`` (``[B, T, H, C]``, zero past the end)
    in float64, as ``chunk_gated_inverse`` lays them out, from ``kda.reference.scalar_gate.chunk_inverse``."""
    from kda.reference.scalar_gate import chunk_inverse

    B, T, H, _ = k.shape
    NC = -(-T // C)
    G = torch.zeros(B, H, NC * C, dtype=torch.float64, device=k.device)
    Tb = torch.zeros(B, T, H, C, dtype=torch.float64, device=k.device)
    heads = lambda x: x.double().transpose(1, 2)                           # [B, H, L, ...]
    for c in range(NC):
        rows = slice(c * C, min((c + 1) * C, T))
        L = rows.stop - rows.start
        Gc, _, Tbc = chunk_inverse(heads(k[:, rows]), heads(g[:, rows]), heads(beta[:, rows]))
        G[:, :, c * C:c * C + L] = Gc / torch.log(torch.tensor(2.0, dtype=torch.float64))
        G[:, :, c * C + L:(c + 1) * C] = G[:, :, c * C + L - 1:c * C + L]
        Tb[:, rows, :, :L] = Tbc.transpose(1, 2)
    return G, Tb


# chunk_gated_inverse's arrangements that compute otherwise (run 110 times them): the lower-left half by tf32 GEMMs,
# the gate's cumsum by a shuffle scan; compact: the same sums, the merge's scratch and Tb's tile in A_s, four blocks
# per SM
ARRANGEMENTS = {"default": {}, "halves": dict(merge="halves"), "scan": dict(cumsum="scan"),
                "halves_scan_heads_first": dict(merge="halves", cumsum="scan", heads_first=True),
                "compact": dict(merge="halves", cumsum="scan", compact=True, min_blocks=4)}


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 129, 2, 128, 64)])
def test_inverse_against_reference_stage(shape, kind, arrangement):
    """``chunk_gated_inverse`` alone: ``G`` (log2, flat past the end) and ``Tb`` against float64,
    outputs poisoned, the ragged last chunk included."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    B, T, H, DK, _ = shape
    C, NC = 64, -(-shape[1] // 64)
    q, k, v, g, beta, _ = inputs(shape, torch.bfloat16, kind, False, seed=zlib.crc32(repr((shape, kind)).encode()))
    G = torch.full((B, H, NC * C), float("nan"), device="cuda")
    Tb = torch.full((B, T, H, C), float("nan"), dtype=torch.bfloat16, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    no_table = torch.empty(1, 1, dtype=torch.int32, device="cuda")          # dense: the chunk table's stand-in
    inverse = compile_program(scalar_gate.chunk_gated_inverse, (), DK=DK, dtype="bfloat16", **ARRANGEMENTS[arrangement])
    inverse(k, g, beta, G, Tb, flags, no_table)
    assert flags.tolist() == [0, 0] and torch.isfinite(G).all() and torch.isfinite(Tb).all()
    G_ref, Tb_ref = reference_inverse(k, g, beta)
    for c in range(NC):
        rows = slice(c * C, min((c + 1) * C, T))
        L = rows.stop - rows.start
        assert rel_l2(G[:, :, rows], G_ref[:, :, rows]) <= 1e-5, c
        assert torch.equal(G[:, :, rows.stop - 1:c * C + C], G[:, :, rows.stop - 1:rows.stop].expand(B, H, C - L + 1))
        assert rel_l2(Tb[:, rows, :, :L], Tb_ref[:, rows, :, :L]) <= 5e-3, c
        assert (Tb[:, rows, :, L:] == 0).all(), c                                # columns past the end


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
def test_compact_inverse_in_fp16(kind, varlen):
    """fp16's ``chunk_gated_inverse(compact=True)`` (on for fp16 since this passed in run 139: ``COMPACT_DTYPES``): ``G`` and
    ``Tb`` bit for bit those of fp16's default arrangement without it, dense and over a packed chunk table, and
    within the bound of float64's."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.packed import chunk_table

    B, T, H, DK = (1 if varlen else 2), 200, 3, 128
    C = 64
    _, k, _, g, beta, _ = inputs((B, T, H, DK, 64), torch.float16, kind, False, seed=zlib.crc32(kind.encode()))
    table = chunk_table([0, 70, 71, 200], "cuda") if varlen else None
    NC = table.chunks.shape[0] if varlen else -(-T // C)
    chunks = table.chunks if varlen else torch.empty(1, 1, dtype=torch.int32, device="cuda")
    runs = []
    for compact in (False, True):
        params = {**scalar_gate.SCALAR_GATE_INVERSE_CONFIG, **(scalar_gate.COMPACT_INVERSE if compact else {})}
        inverse = compile_program(scalar_gate.chunk_gated_inverse, (), DK=DK, dtype="float16", varlen=varlen,
                                  **params)
        G = torch.full((B, H, NC * C), float("nan"), device="cuda")
        Tb = torch.full((B, T, H, C), float("nan"), dtype=torch.float16, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        inverse(k, g, beta, G, Tb, flags, chunks)
        assert flags.tolist() == [0, 0] and torch.isfinite(G).all() and torch.isfinite(Tb).all()
        runs.append((G, Tb))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    if not varlen:
        _, Tb_ref = reference_inverse(k, g, beta)
        assert rel_l2(runs[1][1], Tb_ref) <= 5e-3


@pytest.mark.parametrize("columns", [128, 64])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("shape", [(2, 200, 3, 64, 128), (1, 129, 2, 128, 128)])
def test_pass_against_reference_stage(shape, kind, columns):
    """``inverse_state_output_pass`` alone on a float64 ``Tb`` and ``G`` (rounded as the kernel
    would write them), outputs poisoned, against the recurrence."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    B, T, H, DK, DV = shape
    q, k, v, g, beta, h0 = inputs(shape, torch.bfloat16, kind, False, seed=zlib.crc32(repr((shape, kind)).encode()))
    G, Tb = reference_inverse(k, g, beta)
    G, Tb = G.float(), Tb.bfloat16()
    o = torch.full((B, T, H, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
    ht = torch.full((B, H, DK, DV), float("nan"), device="cuda")
    no_table = torch.empty(1, dtype=torch.int32, device="cuda")
    compile_program(scalar_gate.inverse_state_output_pass, (), DK=DK, DV=DV, block_dv=min(columns, DV),
                    dtype="bfloat16", initial_state=True, final_state=True)(
        q, k, v, Tb, G, DK ** -0.5, 0, h0, o, ht, no_table, no_table, no_table)
    ref_o, ref_ht = ref0.recurrent(q.double() * DK ** -0.5, k, v, g, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND, f"o: {rel_l2(o, ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= BOUND, f"final state: {rel_l2(ht, ref_ht):.2e}"


@pytest.mark.parametrize("first", [1, 3])
def test_pass_from_a_later_chunk(first):
    """``inverse_state_output_pass``'s ``first_chunk`` (the split's warm-up windows where they lie): each sequence
    from that chunk on, from its initial state, against the recurrence over those tokens; the rows before it are
    left as they were (poisoned), a ragged last chunk included, in the default forms."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    B, T, H, D = 2, 300, 3, 128
    q, k, v, g, beta, h0 = inputs((B, T, H, D, D), torch.bfloat16, "runs_of_-20", False, seed=59 + first)
    G, Tb = scalar_gate.scalar_gate_inverse(k, g, beta, H)
    o = torch.full_like(v, float("nan"))
    ht = torch.full((B, H, D, D), float("nan"), device="cuda")
    no_table = torch.empty(1, dtype=torch.int32, device="cuda")
    compile_program(scalar_gate.inverse_state_output_pass, (), DK=D, DV=D, dtype="bfloat16", initial_state=True,
                    final_state=True, **scalar_gate.pass_forms("bfloat16", D, D))(
        q, k, v, Tb, G, D ** -0.5, first, h0, o, ht, no_table, no_table, no_table)
    t0 = first * 64
    assert o[:, :t0].isnan().all()
    ref_o, ref_ht = ref0.recurrent(q[:, t0:].double() * D ** -0.5, k[:, t0:], v[:, t0:], g[:, t0:], beta[:, t0:],
                                   h0, True)
    assert torch.isfinite(o[:, t0:]).all() and torch.isfinite(ht).all()
    assert rel_l2(o[:, t0:], ref_o) <= BOUND, f"o: {rel_l2(o[:, t0:], ref_o):.2e}"
    assert rel_l2(ht, ref_ht) <= BOUND, f"final state: {rel_l2(ht, ref_ht):.2e}"


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_state_flags(initial, final, scalar_path):
    q, k, v, g, beta, h0 = inputs((2, 200, 3, 128, 128), torch.bfloat16, "logsigmoid", False, seed=31)
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0 if initial else None,
                                       output_final_state=final)
    assert (ht is not None) == final and scalar_path == [128]
    start = h0 if initial else torch.zeros_like(h0)
    ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, start, True)
    assert torch.isfinite(o).all() and rel_l2(o, ref_o) <= BOUND
    if final:
        assert torch.isfinite(ht).all() and rel_l2(ht, ref_ht) <= BOUND


def test_grouped_value_heads(scalar_path):
    """q, k with 2 heads, v, g, beta and the states with 6: the same bits as q and k repeated."""
    q, k, v, g, beta, _ = inputs((1, 300, 6, 128, 128), torch.bfloat16, "logsigmoid", False, seed=23)
    q, k = q[:, :, ::3].contiguous(), k[:, :, ::3].contiguous()
    h0 = torch.randn(1, 6, 128, 128, device="cuda")
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    q3, k3 = q.repeat_interleave(3, dim=2), k.repeat_interleave(3, dim=2)
    o3, ht3 = kda.chunk_gated_delta_rule(q3, k3, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o3) and torch.equal(ht, ht3) and scalar_path == [128, 128]
    ref_o, ref_ht = ref0.recurrent(q3.double() * 128 ** -0.5, k3, v, g, beta, h0, True)
    assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND


def test_agrees_with_level5_path(scalar_path, monkeypatch):
    """The two GDN paths on the same inputs (a few thousand tokens, many heads): within the
    rounding of two bf16 pipelines."""
    from kda import gated_delta

    q, k, v, g, beta, h0 = inputs((2, 4000, 8, 128, 128), torch.bfloat16, "logsigmoid", False, seed=37)
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)
    o5, ht5 = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert scalar_path == [128]
    assert rel_l2(o, o5.double()) <= BOUND and rel_l2(ht, ht5.double()) <= BOUND


BAD_VALUES = [("g", 0.5), ("g", float("nan")), ("g", float("-inf")), ("beta", 1.5), ("beta", float("nan")),
              ("beta", -0.1)]


@pytest.mark.parametrize("what,value", BAD_VALUES, ids=[f"{w}={v}" for w, v in BAD_VALUES])
def test_values_out_of_range_raise(what, value, scalar_path):
    """``chunk_gated_inverse`` checks g and beta as it reads them (one bad value in the tail chunk)."""
    q, k, v, g, beta, _ = inputs((1, 200, 2, 64, 64), torch.bfloat16, "logsigmoid", False, seed=5)
    (g if what == "g" else beta)[0, 195, 1] = value
    message = "g must be finite and <= 0" if what == "g" else "beta must lie in"
    with pytest.raises(ValueError, match=message):
        kda.chunk_gated_delta_rule(q, k, v, g, beta)
    kda.chunk_gated_delta_rule(q, k, v, g, beta, check_values=False)       # no read-back, no error
    (g if what == "g" else beta)[0, 195, 1] = -0.5 if what == "g" else 0.5
    kda.chunk_gated_delta_rule(q, k, v, g, beta)
    assert len(scalar_path) == 3


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_packed_sequences(initial, final, scalar_path):
    """Uneven packed lengths (an empty one, a single token, ragged tails) with per-sequence states,
    grouped value heads (2 query/key heads, 4 value heads), against the recurrence per sequence."""
    lengths = [130, 0, 64, 1, 77, 300]
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, T, 4, 128, 128), torch.bfloat16, "runs_of_-20", False, seed=41)
    q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
    h0 = torch.randn(len(lengths), 4, 128, 128, device="cuda") if initial else None
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=final, cu_seqlens=cu)
    assert scalar_path == [128] and (ht is not None) == final
    check_sequences(o, ht, q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta, h0, lengths)


@pytest.mark.parametrize("arrangement", ["halves_scan_heads_first", "compact"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_inverse_arrangement_in_the_op(packed, arrangement, scalar_path, monkeypatch):
    """The op with ``chunk_gated_inverse``'s tf32 halves and shuffle-scan cumsum (``SCALAR_GATE_INVERSE_CONFIG``),
    with the heads first or compact, dense and packed (an empty sequence, one token, ragged tails), against the
    recurrence; a NaN gate in a sequence's tail still raises."""
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "SCALAR_GATE_INVERSE_CONFIG", ARRANGEMENTS[arrangement])
    monkeypatch.setattr(scalar_gate, "COMPACT_DTYPES", ())            # the arrangement as given, compact or not
    lengths = [130, 0, 64, 1, 77, 300] if packed else None
    T = sum(lengths) if packed else 700
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    q, k, v, g, beta, _ = inputs((1, T, 4, 128, 128), torch.bfloat16, "runs_of_-20", False, seed=43)
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    check_sequences(o, ht, q, k, v, g, beta, None, lengths)
    g[0, T - 3, 2] = float("nan")
    with pytest.raises(ValueError, match="g must be finite and <= 0"):
        kda.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    assert scalar_path == [128, 128]


def test_many_short_packed_sequences(scalar_path):
    """300 sequences of 0 to 64 tokens (groups of sequences per block) against each one run alone
    through the same path."""
    lengths = check_many_short_sequences(kda.chunk_gated_delta_rule, False)
    assert scalar_path[0] == 64 and len(scalar_path) == 1 + sum(1 for x in lengths if x)


@pytest.mark.parametrize("pieces", [2, 5])
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20", "mild"])
def test_split_forward(kind, pieces, scalar_path):
    """GDN's intra-card split by the scalar-gate path (the inverse once, the runs' maps and the
    recompute as passes over a batch of runs): a ragged length, an initial state, against the
    recurrence and the unsplit call."""
    from kda.kernels import scalar_gate
    from kda.distributed import split_forward

    q, k, v, g, beta, h0 = inputs((2, 1000, 3, 128, 128), torch.bfloat16, kind, False, seed=43)
    inverses = []
    inverse = scalar_gate.scalar_gate_inverse
    with pytest.MonkeyPatch.context() as patch:           # the split must go through the scalar-gate path
        patch.setattr(scalar_gate, "scalar_gate_inverse", lambda *a, **kw: inverses.append(1) or inverse(*a, **kw))
        o, ht = split_forward(q, k, v, g, beta, pieces, initial_state=h0, output_final_state=True)
    assert inverses == [1]
    ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, h0, True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert rel_l2(o, ref_o) <= BOUND and rel_l2(ht, ref_ht) <= BOUND
    o1, ht1 = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_l2(o, o1.double()) <= BOUND and rel_l2(ht, ht1.double()) <= BOUND


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_single_chunk_output(initial, final, dtype, scalar_path, monkeypatch):
    """``single_chunk_output`` (``scalar_gate.SINGLE_CHUNK_OUTPUT``): GDN with grouped value heads as
    ``check_single_chunk_output`` wants it."""
    from kda.kernels import scalar_gate

    check_single_chunk_output(scalar_gate, kda.chunk_gated_delta_rule, False, initial, final, dtype, monkeypatch,
                              (53, 59), grouped=True)


@pytest.mark.parametrize("whole", [False, True], ids=["in_place", "whole_stores"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_chain_first_same_bits(packed, whole, scalar_path, monkeypatch):
    """``inverse_state_output_pass(chain_first=1, 2)`` (``scalar_gate.CHAIN_FIRST``: the output's GEMMs wait for the
    chain's) makes the same products in the same order, in both forms of the stores: GDN with grouped value heads as
    ``check_chain_first_same_bits`` wants it, every call through the pass."""
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "WHOLE_STORES", whole)
    monkeypatch.setattr(scalar_gate, "CHAIN_SCALES_KEYS", False)     # not with chain_first 2: other roundings
    check_chain_first_same_bits(scalar_gate, kda.chunk_gated_delta_rule, False, packed, monkeypatch, 71, grouped=True)
    assert len(scalar_path) >= 3                       # every call took the pass


# the pass as it was before run 149: X and V' element by element in shared memory, P gated into a shared tile
IN_PLACE = {"WHOLE_STORES": False, "P_IN_REGISTERS": False, "V_IN_REGISTERS": False, "CHAIN_SCALES_KEYS": False}

# forms of inverse_state_output_pass that make the same products on the same operands as IN_PLACE: their module
# switches (the others as in IN_PLACE)
SAME_BITS_FORMS = {"whole_stores": {"WHOLE_STORES": True}, "p_in_registers": {"P_IN_REGISTERS": True},
                   "all_in_registers": {"WHOLE_STORES": True, "P_IN_REGISTERS": True, "V_IN_REGISTERS": True}}


# arrangements of the pass (dtype, head size: the block's key and value columns) for its register forms
PASS_ARRANGEMENTS = {"bf16_128": (torch.bfloat16, 128), "fp16_128": (torch.float16, 128),
                     "bf16_64": (torch.bfloat16, 64)}


def run_pass_forms(arrangement, packed, lengths, seed, forms, monkeypatch):
    """GDN with grouped value heads (2 query/key heads, 4 value heads), initial and final states and runs of -20, as
    one sequence of ``sum(lengths)`` tokens or ``lengths`` packed, through the in-place form (``IN_PLACE``) and then
    each of ``forms`` (switch settings) for ``arrangement`` (``REGISTER_FORMS_TESTED`` widened to it): the inputs and
    ``[(o, ht)]``, the in-place form's first."""
    from kda import launch
    from kda.kernels import scalar_gate

    dtype, D = PASS_ARRANGEMENTS[arrangement]
    monkeypatch.setattr(scalar_gate, "REGISTER_FORMS_TESTED", ((launch.dtype_name(dtype), D, D),))
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if packed else None
    q, k, v, g, beta, _ = inputs((1, T, 4, D, D), dtype, "runs_of_-20", False, seed=seed)
    q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
    h0 = torch.randn(len(lengths), 4, D, D, device="cuda")
    runs = []
    for form in [{}, *forms]:
        for switch, value in {**IN_PLACE, **form}.items():
            monkeypatch.setattr(scalar_gate, switch, value)
        runs.append(kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu))
    return (q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta, h0), runs


@pytest.mark.parametrize("arrangement", list(PASS_ARRANGEMENTS))
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_pass_forms_same_bits(packed, arrangement, scalar_path, monkeypatch):
    """Forms of ``inverse_state_output_pass`` (``SAME_BITS_FORMS``: ``X`` and ``V'`` stored whole, no barrier in any
    step; ``P`` gated in registers and read by ``P V_new`` from there; ``V`` read into registers before ``S``) make
    the same sums in the same order as the in-place form (``IN_PLACE``): the op's outputs and final states equal its
    bit for bit, dense and packed (an empty sequence, one token, ragged tails), bf16 and fp16, heads of 128 and 64; and
    they agree with the recurrence."""
    lengths = [130, 0, 64, 1, 77, 300] if packed else [700]
    (q, k, v, g, beta, h0), runs = run_pass_forms(arrangement, packed, lengths, 47, list(SAME_BITS_FORMS.values()),
                                                  monkeypatch)
    assert len(scalar_path) >= len(runs)               # every call took the pass
    for form, (o, ht) in zip(SAME_BITS_FORMS, runs[1:]):
        assert torch.equal(runs[0][0], o) and torch.equal(runs[0][1], ht), form
    check_sequences(*runs[-1], q, k, v, g, beta, h0, lengths)


@pytest.mark.parametrize("arrangement", list(PASS_ARRANGEMENTS))
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_chain_scales_keys(packed, arrangement, scalar_path, monkeypatch):
    """``inverse_state_output_pass(chain_scales_keys=True)`` (``scalar_gate.CHAIN_SCALES_KEYS`` with the register
    forms): the chain adds ``(2^(G_last - G) K)^T V_new``, rounding the scale on the keys instead of on ``V'``. Against
    the recurrence, dense and packed (an empty sequence, one token, ragged tails, more chunks than two barrier
    phases), bf16 and fp16, heads of 128 and 64, and within 5e-3 of the in-place form."""
    lengths = [130, 0, 64, 1, 77, 300, 1000] if packed else [1500]
    (q, k, v, g, beta, h0), runs = run_pass_forms(arrangement, packed, lengths, 83, [dict.fromkeys(IN_PLACE, True)],
                                                  monkeypatch)
    (o0, ht0), (o, ht) = runs
    assert len(scalar_path) >= 2                       # both calls took the pass
    assert rel_l2(o, o0) <= 5e-3 and rel_l2(ht, ht0) <= 5e-3
    check_sequences(o, ht, q, k, v, g, beta, h0, lengths)


def test_traced_pass_same_output():
    """``inverse_state_output_pass(trace=True)`` (a tuning instrument: ``ht`` holds the warpgroups' clocks) writes the
    same output as the plain pass, bit for bit, and a trace that follows each warpgroup's order of work: every stamp
    written, and none of a warpgroup's earlier than its previous one."""
    from kda import launch
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.kernels.scalar_gate import TRACE_EVENTS

    B, T, H, D = 2, 700, 3, 128
    q, k, v, g, beta, _ = inputs((B, T, H, D, D), torch.bfloat16, "runs_of_-20", False, seed=53)
    G, Tb = scalar_gate.scalar_gate_inverse(k, g, beta, H)
    stand_in, table = launch.stand_in(4, torch.float32, "cuda"), launch.stand_in(1, torch.int32, "cuda")
    outs = []
    trace = torch.full((B * H, (T + 63) // 64, len(TRACE_EVENTS)), -1.0, device="cuda")
    for traced in (False, True):
        kernel = compile_program(scalar_gate.inverse_state_output_pass, (), DK=D, DV=D, dtype="bfloat16",
                                 **({"trace": True} if traced else {}))
        o = torch.full_like(v, float("nan"))
        kernel(q, k, v, Tb, G, D ** -0.5, 0, stand_in, o, trace if traced else stand_in, table, table, table)
        outs.append(o)
    assert torch.equal(outs[0], outs[1]) and not outs[0].isnan().any()
    assert (trace >= 0).all()                          # every stamp written
    for wg in ("chain", "values", "output", "producer"):
        # each warpgroup's events in TRACE_EVENTS follow its code (the in-place form: V' before V_new)
        events = [e for e, (w, _) in enumerate(TRACE_EVENTS) if w == wg]
        stamps = trace[:, :, events].flatten(1)       # chunk by chunk, event by event
        assert (stamps[:, 1:] >= stamps[:, :-1]).all(), wg


# packed_tile_output's arrangement (PACKED_TILE_CONFIG), and whether the values are checked first by a kernel of their
# own (TILE_CHECKS_FIRST; "beside": on a stream of their own, TILE_CHECKS_BESIDE)
TILE_CONFIGS = {"default": ({}, False), "early_scores": (dict(early_scores=True), False),
                "gathered": (dict(early_scores=True, gathered=True), False),
                "gathered_compact": (dict(gathered=True, compact=True), False),
                "in_order_compact": (dict(compact=True), False),
                "gathered_compact_checks_first": (dict(gathered=True, compact=True), True),
                "gathered_compact_checks_beside": (dict(gathered=True, compact=True), "beside")}


@pytest.mark.parametrize("config", list(TILE_CONFIGS))
@pytest.mark.parametrize("kind", ["logsigmoid", "runs_of_-20"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_tiles(dtype, kind, config, scalar_path, monkeypatch):
    """``scalar_gate.PACKED_TILES``: packed sequences of 0 to 64 tokens (a single token, empty ones), no states, by
    ``packed_tile_output`` over tiles of whole sequences, grouped value heads, against the float64 recurrence
    sequence by sequence (outputs poisoned: every row written); a ``beta`` out of range, a positive gate and keys
    past the delta rule's bound raise. Each arrangement of ``TILE_CONFIGS``."""
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "PACKED_TILES", True)
    monkeypatch.setattr(scalar_gate, "PACKED_TILE_CONFIG", TILE_CONFIGS[config][0])
    monkeypatch.setattr(scalar_gate, "TILE_CHECKS_FIRST", bool(TILE_CONFIGS[config][1]))
    monkeypatch.setattr(scalar_gate, "TILE_CHECKS_BESIDE", TILE_CONFIGS[config][1] == "beside")
    gen = torch.Generator().manual_seed(71)
    lengths = torch.randint(0, 65, (200,), generator=gen).tolist() + [1, 0, 64, 1]
    T = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v, g, beta, _ = inputs((1, T, 4, 128, 128), dtype, kind, False, seed=73 if kind == "logsigmoid" else 79)
    q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()        # 2 query and key heads for 4 value heads
    taken, tile_launch = [], scalar_gate.packed_tile_launch
    monkeypatch.setattr(scalar_gate, "packed_tile_launch", lambda *a: taken.append(1) or tile_launch(*a))
    o, ht = kda.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    assert taken and ht is None
    check_sequences(o, None, q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta,
                    lengths=lengths)
    # each bad value in one token of the last value head alone (the second of its key head's group)
    bad_beta = beta.clone()
    bad_beta[0, T // 2, 3] = 1.5
    with pytest.raises(ValueError, match="beta"):
        kda.chunk_gated_delta_rule(q, k, v, g, bad_beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    bad_gate = g.clone()
    bad_gate[0, T - 1, 3] = 0.5
    with pytest.raises(ValueError, match="g must"):
        kda.chunk_gated_delta_rule(q, k, v, bad_gate, beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    long_key, key_beta = k.clone(), beta.clone()
    long_key[0, T // 2, 1] *= 10                               # read by value heads 2 and 3 ...
    key_beta[0, T // 2, 2], key_beta[0, T // 2, 3] = 0.0, 0.5  # ... past the bound for head 3 alone
    with pytest.raises(ValueError, match="k: "):
        kda.chunk_gated_delta_rule(q, long_key, v, g, key_beta, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_beta_in_its_dtype_same_bits(dtype, packed, scalar_path, monkeypatch):
    """``scalar_gate.BETA_IN_ITS_DTYPE``: ``beta`` in the inputs' dtype read as it is gives the outputs and final
    states of the same values made float32 first, bit for bit (the conversion is exact either way), dense and
    packed; a ``beta`` out of range still raises."""
    from kda.kernels import scalar_gate

    q, k, v, g, beta, h0 = inputs((2, 200, 3, 128, 128), dtype, "runs_of_-20", False, seed=83)
    beta = beta.to(dtype)
    cu = torch.tensor([0, 70, 71, 200], device="cuda") if packed else None
    if packed:
        q, k, v, g, beta = (x[:1] for x in (q, k, v, g, beta))
        h0 = torch.randn(3, 3, 128, 128, device="cuda")
    outs = []
    for as_given in (False, True):
        monkeypatch.setattr(scalar_gate, "BETA_IN_ITS_DTYPE", as_given)
        outs.append(kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.isfinite(outs[1][0]).all()
    with pytest.raises(ValueError, match="beta"):
        kda.chunk_gated_delta_rule(q, k, v, g, beta * 2 + 0.5, initial_state=h0, cu_seqlens=cu)


def test_traced_inverse_same_tb():
    """``chunk_gated_inverse(trace=True)`` (a tuning instrument: ``G`` holds the clock stamps) makes the same ``Tb``
    as the default bit for bit, and writes every stamp of every chunk, in order."""
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program
    from kda.kernels.scalar_gate import INVERSE_TRACE_EVENTS

    B, T, H, D = 2, 700, 3, 128
    q, k, v, g, beta, _ = inputs((B, T, H, D, D), torch.bfloat16, "runs_of_-20", False, seed=67)
    NC = -(-T // 64)
    table = torch.empty(1, 1, dtype=torch.int32, device="cuda")
    config = {**scalar_gate.SCALAR_GATE_INVERSE_CONFIG, **scalar_gate.COMPACT_INVERSE}
    outs = []
    for traced in (False, True):
        G = torch.full((B, H, NC * 64), -1.0, device="cuda")
        Tb = torch.full((B, T, H, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
        compile_program(scalar_gate.chunk_gated_inverse, (), DK=D, dtype="bfloat16", **config,
                        **({"trace": True} if traced else {}))(
            k, g.contiguous(), beta.float().contiguous(), G, Tb, torch.zeros(2, dtype=torch.int32, device="cuda"),
            table)
        outs.append((G, Tb))
    assert torch.equal(outs[0][1], outs[1][1]) and not outs[0][1].isnan().any()
    stamps = outs[1][0].view(B, H, NC, 64)[..., :len(INVERSE_TRACE_EVENTS)]
    assert (stamps >= 0).all()                         # every stamp written
    assert (stamps[..., 1:] >= stamps[..., :-1]).all()  # in the order of the kernel's work


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["dense", "packed", "whole_stores", "single_chunk"])
def test_gate_free_inverse(form, dtype, scalar_path, monkeypatch):
    """``scalar_gate.GATE_FREE_INVERSE``: the first kernel's inverse without the gate, gated by the pass's warpgroup 1
    (``gates_inverse``) or by ``single_chunk_output``: GDN with grouped value heads, initial states and runs of -20,
    dense, packed (an empty sequence, one token, ragged tails), with the pass's whole stores, and on packed sequences of
    at most one chunk through the single-chunk kernel; against the recurrence, and within 5e-3 of the gated inverse's
    outputs (the gated tile is rounded twice instead of once)."""
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "WHOLE_STORES", form == "whole_stores")
    monkeypatch.setattr(scalar_gate, "SINGLE_CHUNK_OUTPUT", form == "single_chunk")
    lengths = {"dense": None, "whole_stores": None, "packed": [130, 0, 64, 1, 77, 300],
               "single_chunk": [0, 1, 64, 0, 63, 2, 40, 17, 64, 5]}[form]
    T = sum(lengths) if lengths else 700
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda") if lengths else None
    q, k, v, g, beta, _ = inputs((1, T, 4, 128, 128), dtype, "runs_of_-20", False, seed=59)
    q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
    h0 = torch.randn(len(lengths) if lengths else 1, 4, 128, 128, device="cuda")
    taken, takes = [], scalar_gate.takes_single_chunk_output
    monkeypatch.setattr(scalar_gate, "takes_single_chunk_output", lambda *a: taken.append(takes(*a)) or taken[-1])
    runs = []
    for gate_free in (True, False):
        monkeypatch.setattr(scalar_gate, "GATE_FREE_INVERSE", gate_free)
        runs.append(kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                               cu_seqlens=cu, cu_seqlens_cpu=cu.cpu() if lengths else None))
    assert len(scalar_path) >= 2                       # both calls took the scalar path
    assert any(taken) == (form == "single_chunk")
    check_sequences(runs[0][0], runs[0][1], q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta,
                    h0, lengths)
    assert rel_l2(runs[0][0], runs[1][0].double()) <= 5e-3
    assert rel_l2(runs[0][1], runs[1][1].double()) <= 5e-3
