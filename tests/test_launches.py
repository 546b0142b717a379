"""Every CUDA launch path of the package, checked on the CPU without compiling: each kernel's
``prim_func`` is built, and the launch is replaced by a stand-in that checks the arguments as
tilelang's binder checks them on the GPU (their count, dtype, rank, static sizes, symbolic sizes
bound alike across tensors, contiguity, scalars). A wrong argument list otherwise shows only on a
GPU, at the price of a device call."""

import contextlib

import pytest
import torch

from kda import packed

pytestmark = pytest.mark.tilelang

pytest.importorskip("tilelang")
import tvm  # noqa: E402  (tilelang's own tvm, importable once tilelang is)


def bind_arguments(func, args, name):
    """The binder's checks of ``args`` against the ``prim_func`` ``func``; raises ``AssertionError``
    naming the kernel and the parameter."""
    params = list(func.params)
    assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
    analyzer = tvm.arith.Analyzer()
    bound = {}
    buffers = [(p, func.buffer_map[p], a) for p, a in zip(params, args) if p in func.buffer_map]
    for p, a in zip(params, args):
        if p not in func.buffer_map:
            assert isinstance(a, (int, float)) and not isinstance(a, bool), f"{name}: {p.name} takes a number"
    for p, buf, a in buffers:                 # symbols first: a plain symbol in a shape binds to its size
        assert isinstance(a, torch.Tensor), f"{name}: {buf.name} takes a tensor, got {type(a).__name__}"
        assert str(a.dtype).removeprefix("torch.") == str(buf.dtype), f"{name}: {buf.name} is {buf.dtype}, got {a.dtype}"
        assert a.dim() == len(buf.shape), f"{name}: {buf.name} has rank {len(buf.shape)}, got {a.dim()}"
        assert a.is_contiguous(), f"{name}: {buf.name} must be contiguous"
        for dim, size in zip(buf.shape, a.shape):
            if isinstance(dim, tvm.tirx.Var):
                assert bound.setdefault(dim.name, size) == size, \
                    f"{name}: {buf.name} binds {dim.name} = {size}, already {bound[dim.name]}"
                analyzer.bind(dim, size)
    for p, buf, a in buffers:                 # a symbol seen only as ``symbol + constant`` binds by it
        for dim, size in zip(buf.shape, a.shape):
            free = [v for v in _symbols(dim) if v.name not in bound]
            offset = analyzer.simplify(dim - free[0]) if len(free) == 1 else None
            if isinstance(offset, tvm.tirx.IntImm):
                bound[free[0].name] = size - int(offset)
                analyzer.bind(free[0], size - int(offset))
    for p, buf, a in buffers:                 # then every size, constant or an expression of symbols
        for axis, (dim, size) in enumerate(zip(buf.shape, a.shape)):
            want = analyzer.simplify(dim)
            assert isinstance(want, tvm.tirx.IntImm), f"{name}: {buf.name} axis {axis}: {dim} is not bound"
            assert int(want) == size, f"{name}: {buf.name} axis {axis} must be {int(want)} ({dim}), got {size}"


def _symbols(expr):
    found = []
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, tvm.tirx.Var) else None)
    return list({v.name: v for v in found}.values())


@pytest.fixture
def kernel_launches(monkeypatch):
    """The launch paths run on CPU tensors; every ``compile_program`` returns a stand-in that builds
    the ``prim_func`` and checks its launch. Yields the list of launches ``(kernel, params)``."""
    from kda.kernels import build

    launches = []

    def compile_program(program_fn, out_idx, target=None, pass_configs=None, **params):
        func = program_fn(**params)

        def launch(*args):
            bind_arguments(func, args, program_fn.__name__)
            launches.append((program_fn.__name__, params))
        return launch

    monkeypatch.setattr(build, "compile_program", compile_program)
    monkeypatch.setattr(build, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return launches


def level5_inputs(B=1, T=200, H=2, HV=2, D=64, per_channel=True, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, H, D, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, HV, D, generator=gen).to(dtype)
    g = -torch.rand((B, T, HV, D) if per_channel else (B, T, HV, 1), generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_level5(kernel_launches, per_channel, packed, initial, final):
    """``chunk_intra`` and the state pass, dense (B = 2) and packed (an empty sequence and a
    single token among them), with and without initial and final states."""
    from kda.gated_delta import _run_kernels
    from kda.packed import chunk_table

    bounds = [0, 70, 71, 71, 200]
    q, k, v, g, beta = level5_inputs(B=1 if packed else 2, per_channel=per_channel)
    table = chunk_table(bounds, "cpu") if packed else None
    N = len(bounds) - 1 if packed else 2
    h0 = torch.randn(N, 2, 64, 64) if initial else None
    flags = torch.zeros(2, dtype=torch.int32)
    o, ht = _run_kernels(q, k, v, g, beta, 0.125, h0, flags, table, final)
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "gated_state_output_pass"]
    assert o.shape == v.shape and (ht is None) == (not final)
    assert kernel_launches[1][1]["initial_state"] == initial and kernel_launches[1][1]["final_state"] == final


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("whole", [False, True], ids=["masked_stores", "whole_stores"])
def test_level5_pass_whole_stores_switch(kernel_launches, monkeypatch, whole, packed):
    """``gated_state_pass.WHOLE_STORES`` (on by default since runs 141 and 143) compiles the packed state pass with
    ``whole_stores``; the dense pass, which has no masked stores, never takes it."""
    from kda.gated_delta import _run_kernels
    from kda.kernels import gated_state_pass
    from kda.packed import chunk_table

    assert gated_state_pass.WHOLE_STORES is True
    monkeypatch.setattr(gated_state_pass, "WHOLE_STORES", whole)
    q, k, v, g, beta = level5_inputs(B=1 if packed else 2)
    table = chunk_table([0, 70, 71, 200], "cpu") if packed else None
    _run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32), table)
    name, state_pass = kernel_launches[1]
    assert name == "gated_state_output_pass" and state_pass.get("whole_stores", False) == (whole and packed)


@pytest.mark.parametrize("swizzled", [False, True], ids=["row_major_u", "swizzled_u"])
def test_level5_pass_swizzled_u_switch(kernel_launches, monkeypatch, swizzled):
    """``gated_state_pass.SWIZZLED_U`` (off by default until a GPU tests it) compiles the state pass with
    ``swizzled_u``; off, with the parameters it always had."""
    from kda.gated_delta import _run_kernels
    from kda.kernels import gated_state_pass

    assert gated_state_pass.SWIZZLED_U is False
    monkeypatch.setattr(gated_state_pass, "SWIZZLED_U", swizzled)
    q, k, v, g, beta = level5_inputs(B=2)
    _run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    name, state_pass = kernel_launches[1]
    assert name == "gated_state_output_pass" and ("swizzled_u" in state_pass) == swizzled


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
@pytest.mark.parametrize("HV,D", [(2, 64), (6, 128)], ids=["heads", "grouped_128"])
def test_gdn_scalar_gate_path(kernel_launches, monkeypatch, HV, D, initial, final):
    """With its switch on and blocks enough, GDN takes ``kda.kernels.scalar_gate``'s two kernels
    (grouped value heads, states in and out); the columns per block follow ``DV``."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    q, k, v, g, beta = level5_inputs(B=2, H=2, HV=HV, D=D, per_channel=False)
    h0 = torch.randn(2, HV, D, D) if initial else None
    o, ht = gated_delta._run_kernels(q, k, v, g, beta, 0.125, h0, torch.zeros(2, dtype=torch.int32),
                                     output_final_state=final)
    assert [name for name, _ in kernel_launches] == ["chunk_gated_inverse", "inverse_state_output_pass"]
    inverse, state_pass = (params for _, params in kernel_launches)
    assert inverse["value_groups"] == state_pass["value_groups"] == HV // 2
    assert state_pass["block_dv"] == D and state_pass["initial_state"] == initial
    assert o.shape == v.shape and (ht is None) == (not final)


# (module with the switch, the kernel it sends to, the pass it replaces, per channel (KDA) or per head (GDN))
SINGLE_CHUNK_KERNELS = [("gated_state_pass", "single_chunk_gated_output", "gated_state_output_pass", True),
                        ("scalar_gate", "single_chunk_output", "inverse_state_output_pass", False)]


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
@pytest.mark.parametrize("bounds,single", [([0, 64, 64, 65, 100], True), ([0, 64, 129], False), (None, False)],
                         ids=["short", "a_long_one", "device_table"])
@pytest.mark.parametrize("module,kernel,pass_name,per_channel", SINGLE_CHUNK_KERNELS, ids=["kda", "gdn"])
def test_single_chunk_output_switch(kernel_launches, monkeypatch, module, kernel, pass_name, per_channel, bounds,
                                    single, initial, final):
    """``SINGLE_CHUNK_OUTPUT`` of ``gated_state_pass`` (KDA) and ``scalar_gate`` (GDN; grouped value heads), off by
    default until a GPU has tested them, sends packed sequences that all fit one chunk, as a host-built table knows, to
    the single-chunk kernel with the pass's arguments (states or none); a longer sequence, or a table built on the
    device (no read-back), keeps the pass."""
    import importlib

    from kda import gated_delta, packed

    switches = importlib.import_module(f"kda.kernels.{module}")
    assert switches.SINGLE_CHUNK_OUTPUT is False
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr(switches, "SINGLE_CHUNK_OUTPUT", True)
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "PACKED_TILES", False)     # it would take GDN's stateless calls (tested below)
    cu = [0, 64, 64, 65, 100] if bounds is None else bounds
    q, k, v, g, beta = level5_inputs(T=cu[-1], H=2 if per_channel else 1, HV=2, D=128, per_channel=per_channel)
    table = packed.chunk_table(cu, "cpu") if bounds is not None else packed.device_chunk_table(torch.tensor(cu), cu[-1])
    h0 = torch.randn(len(cu) - 1, 2, 128, 128) if initial else None
    o, ht = gated_delta._run_kernels(q, k, v, g, beta, 0.125, h0, torch.zeros(2, dtype=torch.int32), table,
                                     output_final_state=final)
    name, params = kernel_launches[1]
    assert name == (kernel if single else pass_name)
    assert params["initial_state"] == initial and params["final_state"] == final
    assert per_channel or params["value_groups"] == 2
    assert o.shape == v.shape and (ht is None) == (not final)


@pytest.mark.parametrize("chain_first", [0, 1, 2])
@pytest.mark.parametrize("module,pass_name,per_channel", [("gated_state_pass", "gated_state_output_pass", True),
                                                          ("scalar_gate", "inverse_state_output_pass", False)],
                         ids=["kda", "gdn"])
def test_pass_chain_first_switch(kernel_launches, monkeypatch, module, pass_name, per_channel, chain_first):
    """``CHAIN_FIRST`` of ``gated_state_pass`` (KDA's state pass) and ``scalar_gate`` (GDN's), 0 by default until a GPU
    has tested them, compiles the pass with ``chain_first``; at 0 the pass compiles with the parameters it always
    had."""
    import importlib

    from kda import gated_delta

    switches = importlib.import_module(f"kda.kernels.{module}")
    assert switches.CHAIN_FIRST == 0
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr(switches, "CHAIN_FIRST", chain_first)
    q, k, v, g, beta = level5_inputs(B=2, H=2, D=128 if not per_channel else 64, per_channel=per_channel)
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    name, state_pass = kernel_launches[1]
    assert name == pass_name and state_pass.get("chain_first", 0) == chain_first
    assert chain_first or "chain_first" not in state_pass


@pytest.mark.parametrize("bounds", [None, [0, 64, 129], [0, 64, 64, 65, 100]], ids=["dense", "packed", "short"])
@pytest.mark.parametrize("gate_free", [False, True], ids=["gated", "gate_free"])
def test_gdn_gate_free_inverse_switch(kernel_launches, monkeypatch, gate_free, bounds):
    """``scalar_gate.GATE_FREE_INVERSE`` (off by default until a GPU has tested and timed it) compiles the first kernel
    with ``gate_free`` and the kernel after it (the pass, dense or packed, or the single-chunk kernel) with
    ``gates_inverse``, both or neither; off, neither parameter is passed (the kernels compile as they always did)."""
    from kda import gated_delta, packed
    from kda.kernels import scalar_gate

    assert scalar_gate.GATE_FREE_INVERSE is False
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr(scalar_gate, "GATE_FREE_INVERSE", gate_free)
    monkeypatch.setattr(scalar_gate, "SINGLE_CHUNK_OUTPUT", True)
    q, k, v, g, beta = level5_inputs(T=bounds[-1] if bounds else 100, B=1, H=1, HV=2, D=128, per_channel=False)
    table = packed.chunk_table(bounds, "cpu") if bounds else None
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32), table)
    (first, inverse), (second, after) = kernel_launches[:2]
    assert first == "chunk_gated_inverse"
    assert second == ("single_chunk_output" if bounds and bounds[-1] == 100 else "inverse_state_output_pass")
    assert inverse.get("gate_free", False) == after.get("gates_inverse", False) == gate_free
    assert gate_free or ("gate_free" not in inverse and "gates_inverse" not in after)


def gdn_pass_parameters(kernel_launches, monkeypatch, D=128, dtype=torch.bfloat16, **switches) -> dict:
    """The parameters ``inverse_state_output_pass`` compiles with where ``scalar_gate``'s module ``switches`` are set
    (dense GDN through the scalar-gate path, heads of ``D``)."""
    from kda import gated_delta
    from kda.kernels import scalar_gate

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    for switch, value in switches.items():
        monkeypatch.setattr(scalar_gate, switch, value)
    q, k, v, g, beta = level5_inputs(B=2, H=2, D=D, per_channel=False, dtype=dtype)
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    name, state_pass = kernel_launches[1]
    assert name == "inverse_state_output_pass"
    return state_pass


@pytest.mark.parametrize("D, dtype", [(64, torch.float16)], ids=["fp16_heads_of_64"])
def test_gdn_pass_register_forms_only_where_tested(kernel_launches, monkeypatch, D, dtype):
    """The pass's register forms (on by default) are taken only for the arrangements of
    ``scalar_gate.REGISTER_FORMS_TESTED`` (bf16 and fp16 with 128 key and value columns, bf16 with 64): fp16 heads of
    64 keep the in-place form until their GPU tests have run."""
    state_pass = gdn_pass_parameters(kernel_launches, monkeypatch, D=D, dtype=dtype)
    assert not {"whole_stores", "p_in_registers", "v_in_registers", "chain_scales_keys"} & set(state_pass)
    kernel_launches.clear()
    assert gdn_pass_parameters(kernel_launches, monkeypatch)["chain_scales_keys"] is True     # bf16, 128: taken


@pytest.mark.parametrize("whole", [False, True], ids=["in_place", "whole_stores"])
def test_gdn_pass_whole_stores_switch(kernel_launches, monkeypatch, whole):
    """``scalar_gate.WHOLE_STORES`` (on by default since run 149, beside ``P_IN_REGISTERS``) compiles the pass with
    ``whole_stores``; off, without it."""
    from kda.kernels import scalar_gate

    assert scalar_gate.WHOLE_STORES is True
    state_pass = gdn_pass_parameters(kernel_launches, monkeypatch, WHOLE_STORES=whole)
    assert state_pass.get("whole_stores", False) == whole and ("whole_stores" in state_pass) == whole


@pytest.mark.parametrize("whole", [False, True], ids=["in_place", "whole_stores"])
@pytest.mark.parametrize("p, v_regs", [(False, False), (True, False), (True, True), (False, True)],
                         ids=["neither", "p", "p_and_v", "v"])
def test_gdn_pass_register_operand_switches(kernel_launches, monkeypatch, p, v_regs, whole):
    """``scalar_gate.P_IN_REGISTERS`` and ``V_IN_REGISTERS`` (on by default since run 149) compile the pass with
    ``p_in_registers`` and, only beside ``whole_stores``, ``v_in_registers``; off, without them."""
    from kda.kernels import scalar_gate

    assert scalar_gate.P_IN_REGISTERS is True and scalar_gate.V_IN_REGISTERS is True
    state_pass = gdn_pass_parameters(kernel_launches, monkeypatch, WHOLE_STORES=whole, P_IN_REGISTERS=p,
                                     V_IN_REGISTERS=v_regs)
    assert state_pass.get("p_in_registers", False) == p and ("p_in_registers" in state_pass) == p
    assert state_pass.get("v_in_registers", False) == (v_regs and whole)
    assert ("v_in_registers" in state_pass) == (v_regs and whole)


@pytest.mark.parametrize("whole, chain_first, gate_free", [(True, 0, False), (False, 0, False), (True, 1, False),
                                                           (True, 2, False), (True, 0, True)])
def test_gdn_pass_chain_scales_keys_switch(kernel_launches, monkeypatch, whole, chain_first, gate_free):
    """``scalar_gate.CHAIN_SCALES_KEYS`` (on by default since run 149) compiles the pass with ``chain_scales_keys``
    only beside ``WHOLE_STORES`` and without ``CHAIN_FIRST = 2`` or ``GATE_FREE_INVERSE`` (whose barriers and tile it
    would share)."""
    from kda.kernels import scalar_gate

    assert scalar_gate.CHAIN_SCALES_KEYS is True
    state_pass = gdn_pass_parameters(kernel_launches, monkeypatch, CHAIN_SCALES_KEYS=True, WHOLE_STORES=whole,
                                     CHAIN_FIRST=chain_first, GATE_FREE_INVERSE=gate_free)
    assert ("chain_scales_keys" in state_pass) == (whole and chain_first < 2 and not gate_free)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gdn_inverse_is_compact(kernel_launches, monkeypatch, dtype):
    """``chunk_gated_inverse`` compiles compact, four blocks per SM, for bf16 (run 135's GPU tests and timing) and fp16
    (run 139: bit for bit fp16's default arrangement); without ``COMPACT_DTYPES`` it keeps its own buffers."""
    from kda import gated_delta
    from kda.kernels import scalar_gate

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    q, k, v, g, beta = level5_inputs(B=2, H=2, D=128, per_channel=False, dtype=dtype)
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    name, inverse = kernel_launches[0]
    assert name == "chunk_gated_inverse" and inverse["merge"] == "halves" and inverse["cumsum"] == "scan"
    assert inverse.get("compact") is True and inverse.get("min_blocks") == 4
    kernel_launches.clear()
    monkeypatch.setattr(scalar_gate, "COMPACT_DTYPES", ())
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    name, inverse = kernel_launches[0]
    assert "compact" not in inverse and "min_blocks" not in inverse


@pytest.mark.parametrize("final", [False, True], ids=["no_final", "final"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_gdn_scalar_gate_path_packed(kernel_launches, monkeypatch, initial, final):
    """Packed sequences (an empty one and a single token among them) through the scalar-gate path:
    the chunk table in the first kernel, the sequence tables and one state per sequence in the pass."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    bounds = [0, 70, 71, 71, 200]
    q, k, v, g, beta = level5_inputs(B=1, H=2, HV=4, per_channel=False)
    h0 = torch.randn(4, 4, 64, 64) if initial else None
    o, ht = gated_delta._run_kernels(q, k, v, g, beta, 0.125, h0, torch.zeros(2, dtype=torch.int32),
                                     packed.chunk_table(bounds, "cpu"), final)
    assert [name for name, _ in kernel_launches] == ["chunk_gated_inverse", "inverse_state_output_pass"]
    assert all(params["varlen"] for _, params in kernel_launches)
    assert o.shape == v.shape and (ht is None) == (not final) and (ht is None or ht.shape == (4, 4, 64, 64))


@pytest.mark.parametrize("tiles", [False, True], ids=["chunks", "tiles"])
def test_sequence_tiles_switch(kernel_launches, monkeypatch, tiles):
    """``gated_delta.TILES_OF_SHORT_SEQUENCES``: level 5's path (a gate per channel, grouped value heads) over packed
    sequences of at most one chunk each with no states takes the tiles of whole sequences as its chunks:
    ``chunk_intra`` compiled with ``tile_sequences`` binds each token's sequence, and both kernels see 4 chunks, not
    5; with a state in or out, or a longer sequence, the sequences' own chunks."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "TILES_OF_SHORT_SEQUENCES", tiles)
    bounds = [0, 40, 41, 41, 100, 164, 200]                 # an empty sequence and a single token
    intra = level5_packed_launches(kernel_launches, bounds, "tile_sequences", others=[dict(b=[0, 65, 200])])
    assert intra["varlen"] and bool(intra.get("tile_sequences")) is tiles
    chunks = packed.sequence_tile_table(bounds, "cpu")[0].chunks
    assert chunks.tolist() == [[0, 41], [41, 59], [100, 64], [164, 36]]


def level5_packed_launches(kernel_launches, bounds, flag, T=200, per_channel=True, others=()):
    """Level 5's path (2 query and key heads, 4 value heads) on packed sequences with boundaries ``bounds``: its two
    kernels launched, ``o`` of ``v``'s shape and no final state; then with a state in, a state out and each call of
    ``others`` (``b``, ``h0``, ``final``), ``chunk_intra`` compiled without ``flag``. Returns the first call's
    ``chunk_intra`` parameters."""
    from kda import gated_delta

    q, k, v, g, beta = level5_inputs(B=1, T=T, H=2, HV=4, per_channel=per_channel)
    run = lambda b, h0=None, final=False: gated_delta._run_kernels(
        q, k, v, g, beta, 0.125, h0, torch.zeros(2, dtype=torch.int32), packed.chunk_table(b, "cpu"), final)
    o, ht = run(bounds)
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "gated_state_output_pass"]
    assert o.shape == v.shape and ht is None
    intra = kernel_launches[0][1]
    N = len(bounds) - 1
    for other in (dict(b=bounds, h0=torch.randn(N, 4, 64, 64)), dict(b=bounds, final=True), *others):
        kernel_launches.clear()
        run(**other)
        assert not kernel_launches[0][1].get(flag)
    return intra


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn_on_level5"])
def test_stream_of_chunks_switch(kernel_launches, monkeypatch, per_channel):
    """``gated_delta.STREAM_OF_CHUNKS``: level 5's path over packed sequences of any lengths with no states runs the
    packed tokens as one stream of ``ceil(T / 64)`` chunks (``packed.stream_table``): ``chunk_intra`` compiled with
    ``stream`` (and ``tile_sequences``) binds each token's sequence, the pass runs over the one stream; with a state
    in or out, the sequences' own chunks."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "STREAM_OF_CHUNKS", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)
    bounds = [0, 40, 41, 41, 100, 230, 300]                 # an empty sequence, a single token, one of three chunks
    intra = level5_packed_launches(kernel_launches, bounds, "stream", T=300, per_channel=per_channel)
    assert intra["varlen"] and intra.get("stream") and intra.get("tile_sequences")
    table, starts = packed.stream_table(bounds, "cpu")
    assert table.chunks.tolist() == [[0, 64], [64, 64], [128, 64], [192, 64], [256, 44]]
    assert table.cu_seqlens.tolist() == [0, 300] and starts.tolist()[99:101] == [41, 100]


@pytest.mark.parametrize("tiles", [False, True, "gathered"], ids=["pass", "packed_tiles", "gathered"])
def test_gdn_packed_tiles_switch(kernel_launches, monkeypatch, tiles):
    """``scalar_gate.PACKED_TILES``: packed sequences of at most one chunk each, no states, in one launch of
    ``packed_tile_output`` over the tiles of whole sequences (``packed.sequence_tiles``, or with ``gathered`` in
    ``PACKED_TILE_CONFIG`` ``packed.sequence_rows`` and its row map: an empty one and a single token among them,
    grouped value heads, the keys' check); with a state in or out, or a longer sequence, the inverse and the pass as
    before; off, the pass."""
    from kda import gated_delta
    from kda.kernels import scalar_gate

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr(scalar_gate, "PACKED_TILES", bool(tiles))
    monkeypatch.setattr(scalar_gate, "PACKED_TILE_CONFIG", dict(early_scores=True, gathered=tiles == "gathered"))
    monkeypatch.setattr(scalar_gate, "BETA_IN_ITS_DTYPE", True)
    bounds = [0, 40, 41, 41, 100, 164, 200]
    q, k, v, g, beta = level5_inputs(B=1, H=2, HV=4, per_channel=False)
    beta = beta.bfloat16()                                  # read as it is, no float32 copy
    run = lambda b, h0=None, final=False: gated_delta._run_kernels(
        q, k, v, g, beta, 0.125, h0, torch.zeros(3, dtype=torch.int32), packed.chunk_table(b, "cpu"), final)
    o, ht = run(bounds)
    names = [name for name, _ in kernel_launches]
    assert names == (["packed_tile_output"] if tiles else ["chunk_gated_inverse", "inverse_state_output_pass"])
    assert o.shape == v.shape and ht is None
    if tiles:
        params = kernel_launches[0][1]
        assert params["value_groups"] == 2 and params.get("check_keys") and params["beta_dtype"] == "bfloat16"
        assert params["gathered"] == (tiles == "gathered")
    for other in (dict(b=bounds, h0=torch.randn(6, 4, 64, 64)), dict(b=bounds, final=True), dict(b=[0, 65, 200])):
        kernel_launches.clear()
        run(**other)
        assert [name for name, _ in kernel_launches] == ["chunk_gated_inverse", "inverse_state_output_pass"]


@pytest.mark.parametrize("as_given", [False, True], ids=["float32", "its_dtype"])
def test_gdn_beta_in_its_dtype_switch(kernel_launches, monkeypatch, as_given):
    """``scalar_gate.BETA_IN_ITS_DTYPE``: the first kernel compiled for a bf16 ``beta`` and handed it as it is; off,
    compiled for float32 and handed a float32 copy; a float32 ``beta`` as it is either way."""
    from kda import gated_delta
    from kda.kernels import build, scalar_gate

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    monkeypatch.setattr(scalar_gate, "BETA_IN_ITS_DTYPE", as_given)
    handed, stand_in = [], build.compile_program
    monkeypatch.setattr(build, "compile_program", lambda fn, out_idx, **params: (
        lambda launch: lambda *args: handed.append(args) or launch(*args))(stand_in(fn, out_idx, **params)))
    q, k, v, g, beta = level5_inputs(B=1, H=2, HV=2, per_channel=False)
    for b in (beta.bfloat16(), beta.float()):
        kernel_launches.clear()
        handed.clear()
        gated_delta._run_kernels(q, k, v, g, b, 0.125, None, torch.zeros(2, dtype=torch.int32))
        want = b.dtype if as_given else torch.float32
        assert kernel_launches[0][0] == "chunk_gated_inverse" and handed[0][2].dtype == want
        assert kernel_launches[0][1].get("beta_dtype", "float32") == str(want).removeprefix("torch.")


@pytest.mark.parametrize("in_split", [False, True], ids=["gated", "gate_free_in_split"])
def test_gdn_gate_free_in_split_switch(kernel_launches, monkeypatch, in_split):
    """``scalar_gate.GATE_FREE_IN_SPLIT``: GDN's split compiles its inverse gate-free and both passes gating it
    (without ``chain_scales_keys``); the unsplit op keeps the gated inverse either way."""
    from kda import distributed, gated_delta
    from kda.kernels import scalar_gate

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(distributed, "SCALAR_GATE_SPLIT", True)
    monkeypatch.setattr(distributed, "WARMUP_WINDOWS", {})
    monkeypatch.setattr(distributed, "window_serves", lambda *args: torch.tensor(True))
    monkeypatch.setattr(scalar_gate, "GATE_FREE_IN_SPLIT", in_split)
    q, k, v, g, beta = level5_inputs(B=1, T=256, H=2, HV=2, D=128, per_channel=False)
    k = (k.float() / k.float().norm(dim=-1, keepdim=True)).to(k.dtype)
    distributed._split_forward_cuda(q, k, v, g[..., 0], beta, 2, 128, 0.125, None, True, False, warmup=True)
    inverse, *passes = kernel_launches
    assert bool(inverse[1].get("gate_free")) is in_split
    assert [bool(p.get("gates_inverse")) for _, p in passes] == [in_split] * 2
    assert [bool(p.get("chain_scales_keys")) for _, p in passes] == [not in_split] * 2
    kernel_launches.clear()
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
    gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32))
    assert not kernel_launches[0][1].get("gate_free") and not kernel_launches[1][1].get("gates_inverse")


def test_sequence_tiles():
    """Tiles of whole sequences, each filled while the next one fits; empty sequences take no room; each token's
    sequence by its first token."""
    tiles, starts = packed.sequence_tiles((0, 40, 41, 41, 100, 164, 200, 201), "cpu")
    assert tiles.tolist() == [[0, 41], [41, 59], [100, 64], [164, 37]]
    assert starts.tolist() == [0] * 40 + [40] + [41] * 59 + [100] * 64 + [164] * 36 + [200]
    with pytest.raises(ValueError, match="at most 64"):
        packed.sequence_tiles((0, 65), "cpu")


@pytest.mark.parametrize("beside", [False, True], ids=["in_line", "beside"])
def test_gdn_packed_tiles_checks_first(beside, kernel_launches, monkeypatch):
    """``scalar_gate.TILE_CHECKS_FIRST``: a checked packed call on the tiles queues ``token_value_checks`` (the keys'
    check in it) and then the tile kernel (no keys' check, the first two flags); unchecked, the tile kernel alone.
    The same with ``TILE_CHECKS_BESIDE`` (on the CPU ``validate.check_beside`` runs them one after the other)."""
    from kda import gated_delta
    from kda.kernels import scalar_gate

    monkeypatch.setattr(scalar_gate, "TILE_CHECKS_BESIDE", beside)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", True)
    monkeypatch.setattr(scalar_gate, "PACKED_TILES", True)
    monkeypatch.setattr(scalar_gate, "TILE_CHECKS_FIRST", True)
    q, k, v, g, beta = level5_inputs(B=1, H=2, HV=4, per_channel=False)
    table = packed.chunk_table([0, 40, 41, 41, 100, 164, 200], "cpu")
    checked = []
    for check in (lambda flags: checked.append(flags.tolist()), None):
        kernel_launches.clear()
        gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(3, dtype=torch.int32), table, False,
                                 check)
        names = [name for name, _ in kernel_launches]
        assert names == (["token_value_checks", "packed_tile_output"] if check else ["packed_tile_output"])
        params = dict(kernel_launches)
        assert params["packed_tile_output"].get("check_keys", False) is (check is None)
        if check:
            assert params["token_value_checks"]["check_keys"] and params["token_value_checks"]["value_groups"] == 2
    assert checked == [[0, 0, 0]]


def test_sequence_rows_best_fit():
    """``packed.sequence_rows``: whole sequences packed into tiles by best fit, longest first (fewer tiles than in
    order), each token on exactly one row, a sequence's tokens on rows one after another in order, the rows past a
    tile's length repeating its last token; empty sequences take no room; ``starts`` as ``sequence_tiles``'."""
    bounds = (0, 40, 41, 41, 100, 164, 200, 201)
    tiles, rows, starts = packed.sequence_rows(bounds, "cpu")
    assert tiles.tolist() == [[0, 40], [40, 61], [100, 64], [164, 36]]
    assert rows[1].tolist() == [40] + list(range(41, 100)) + [200] * 4
    assert rows[0].tolist() == list(range(40)) + [39] * 24
    assert torch.equal(starts, packed.sequence_tiles(bounds, "cpu")[1])
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 65, (300,), generator=gen).tolist()
    bounds = (0, *torch.tensor(lengths).cumsum(0).tolist())
    tiles, rows, _ = packed.sequence_rows(bounds, "cpu")
    held = torch.cat([r[:n] for r, (_, n) in zip(rows, tiles.tolist())])
    assert torch.equal(held.sort().values, torch.arange(bounds[-1], dtype=torch.int32))
    assert all(r[n - 1:].eq(r[n - 1]).all() for r, (_, n) in zip(rows, tiles.tolist()))
    for s, e in zip(bounds[:-1], bounds[1:]):                  # each sequence on consecutive rows of one tile
        if e > s:
            tile, row = divmod(int((rows.flatten() == s).nonzero()[0]), 64)
            assert rows[tile, row:row + e - s].tolist() == list(range(s, e))
    assert len(tiles) < len(packed.tile_spans(bounds)) and len(tiles) <= -(-bounds[-1] // 64) + 3
    with pytest.raises(ValueError, match="at most 64"):
        packed.sequence_rows((0, 65), "cpu")


def test_gdn_scalar_gate_path_only_where_it_pays(kernel_launches, monkeypatch):
    """Switched on, the scalar-gate path still leaves to level 5 a batch of too few blocks for the
    SMs, a per-channel gate and, with ``SCALAR_GATE_PACKED`` off, packed sequences; with it on (the
    default since run 112) packed sequences take the scalar-gate path."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    assert gated_delta.scalar_gate_columns(1, 96, 128, 132) == 128
    assert gated_delta.scalar_gate_columns(1, 32, 128, 132) is None
    assert gated_delta.scalar_gate_columns(4, 32, 64, 132) == 64
    level5, scalar = ["chunk_intra", "gated_state_output_pass"], ["chunk_gated_inverse", "inverse_state_output_pass"]
    two_sequences = packed.chunk_table([0, 70, 200], "cpu")
    for per_channel, table, blocks, packed_path, want in ((False, None, 0.5, True, level5),
                                                          (True, None, 0.0, True, level5),
                                                          (False, two_sequences, 0.0, False, level5),
                                                          (False, two_sequences, 0.0, True, scalar)):
        monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", blocks)   # 0: only the gate or packing decides
        monkeypatch.setattr(gated_delta, "SCALAR_GATE_PACKED", packed_path)
        kernel_launches.clear()
        q, k, v, g, beta = level5_inputs(B=1 if table is not None else 2, per_channel=per_channel)
        gated_delta._run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32), table)
        assert [name for name, _ in kernel_launches] == want


def test_level5_grouped_value_heads(kernel_launches):
    """q and k with 2 heads, v, g, beta and the states with 6 (value head i reads head i // 3)."""
    from kda.gated_delta import _run_kernels

    q, k, v, g, beta = level5_inputs(H=2, HV=6)
    _run_kernels(q, k, v, g, beta, 0.125, torch.randn(1, 6, 64, 64), torch.zeros(2, dtype=torch.int32))
    assert kernel_launches[0][1]["value_groups"] == 3


def test_level5_state_pass_columns_by_groups(kernel_launches):
    """Packed sequences choose the state pass's width by their groups, not their count: 100
    one-token sequences of 2 heads of 64 value columns would give 200 blocks of 64 columns, but
    they are 4 groups (windows of 32 chunks), so the pass takes stripes of 32 to cover more SMs."""
    from kda.gated_delta import _run_kernels
    from kda.kernels.gated_state_pass import state_pass_columns
    from kda.packed import chunk_table

    q, k, v, g, beta = level5_inputs(T=100)
    table = chunk_table(list(range(101)), "cpu")
    assert table.seq_groups.tolist() == [0, 32, 64, 96, 100]
    assert state_pass_columns(100, 2, 64, 132) == 64
    _run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32), table, False)
    assert kernel_launches[1][1]["block_dv"] == 32


def test_split_maps(kernel_launches):
    """The intra-card split's maps: the runs as a batch, then two state passes (from zero, and
    with U = 0 from the identity)."""
    from kda import distributed

    q, k, v, g, beta = level5_inputs(T=256)
    from kda.kernels.chunk_intra import prepare_chunks

    runs = distributed.runs_form(prepare_chunks(q, k, v, g, beta, 0.125), 2)
    M, Bm = distributed.chunk_maps(runs)
    assert M.shape == (2, 2, 64, 64) and Bm.shape == (2, 2, 64, 64)
    assert [name for name, _ in kernel_launches] == ["chunk_intra"] + ["gated_state_output_pass"] * 2


@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "ragged_runs"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero_start", "initial"])
def test_split_by_the_scalar_gate_path(kernel_launches, monkeypatch, initial, ragged):
    """GDN's split with the scalar-gate path on: the inverse once, then three passes over the runs as
    a batch (M from the identity with V = 0, B from zero, then from each run's start); a ragged
    length padded to whole runs, or with ``RAGGED_RUNS`` read where it lies (the passes' ``runs`` form, G in rows of
    whole runs, one state per run)."""
    from kda import distributed, gated_delta
    from kda.kernels import build

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(distributed, "SCALAR_GATE_SPLIT", True)
    monkeypatch.setattr(distributed, "RAGGED_RUNS", ragged)
    arguments, stand_in = [], build.compile_program
    monkeypatch.setattr(build, "compile_program", lambda fn, out_idx, **params: (
        lambda launch: lambda *args: arguments.append(args) or launch(*args))(stand_in(fn, out_idx, **params)))
    q, k, v, g, beta = level5_inputs(B=2, T=250, per_channel=False)
    g = g[..., 0]
    h0 = torch.randn(2, 2, 64, 64) if initial else None
    o, ht = distributed._split_forward_cuda(q, k, v, g, beta, 2, 128, 0.125, h0, True, False)
    assert [name for name, _ in kernel_launches] == ["chunk_gated_inverse"] + ["inverse_state_output_pass"] * 3
    passes = [params for _, params in kernel_launches[1:]]
    assert [p["initial_state"] for p in passes] == [True, False, True] and passes[0]["DV"] == 64
    assert [bool(p.get("runs")) for p in passes] == [ragged] * 3
    assert o.shape == v.shape and ht.shape == (2, 2, 64, 64)
    inverse, *pass_arguments = arguments                      # q, k, v, Tb, G, scale, first_chunk, h0, o, ht, ...
    assert inverse[3].shape == (4, 2, 128)                    # G: a row of two chunks for each of 2 x 2 runs
    for args in pass_arguments:
        assert args[4] is inverse[3] and args[8].shape[0] == (2 if ragged else 4)
        assert (args[0].data_ptr() == q.data_ptr()) is ragged   # as it lies, or a copy padded to 256
    assert [args[7].shape[0] for args in pass_arguments] == [4, 1, 4]   # a start for each run (the second: zeros)
    assert [args[9].shape[0] for args in pass_arguments] == [4, 4, 4]   # an end for each run


@pytest.mark.parametrize("scalar_path", [False, True], ids=["level5", "scalar_gate"])
def test_split_warmup_starts(kernel_launches, monkeypatch, scalar_path):
    """Warm-up starts: the window remembered for the split's sizes (one chunk at first) launched at once, a pass
    over the runs' windows from zero whose ends start the runs, then the pass over the runs; the window checked
    on the device behind them. Where it does not serve, the window read back and the two passes again (and
    remembered); where none serves, exact starts, or the unsplit pass where only warm-up starts pay."""
    from kda import distributed, gated_delta

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", scalar_path)
    monkeypatch.setattr(distributed, "SCALAR_GATE_SPLIT", scalar_path)
    monkeypatch.setattr(distributed, "WARMUP_WINDOWS", {})
    q, k, v, g, beta = level5_inputs(B=2, T=250, per_channel=not scalar_path)
    k = (k.float() / k.float().norm(dim=-1, keepdim=True)).to(k.dtype)   # within the delta rule's bound
    g = g[..., 0] if scalar_path else g
    first, state_pass = (("chunk_gated_inverse", "inverse_state_output_pass") if scalar_path
                         else ("chunk_intra", "gated_state_output_pass"))
    split = lambda **kw: distributed._split_forward_cuda(q, k, v, g, beta, 2, 128, 0.125, torch.randn(2, 2, 64, 64),
                                                         True, False, warmup=True, **kw)
    # the launches hold no values: what the device check and the read-back window say is set here
    monkeypatch.setattr(distributed, "window_serves", lambda *args: torch.tensor(True))
    o, ht = split()
    assert [name for name, _ in kernel_launches] == [first] + [state_pass] * 2
    assert [params["initial_state"] for _, params in kernel_launches[1:]] == [False, True]
    assert o.shape == v.shape and ht.shape == (2, 2, 64, 64)
    kernel_launches.clear()                         # the first window does not serve; two chunks do (two of a run)
    monkeypatch.setattr(distributed, "window_serves", lambda *args: torch.tensor(False))
    monkeypatch.setattr(distributed, "warmup_chunks", lambda falls: 2)
    split()
    assert [name for name, _ in kernel_launches] == [first] + [state_pass] * 4
    assert list(distributed.WARMUP_WINDOWS.values()) == [2]
    kernel_launches.clear()                         # none serves, and only warm-up starts would pay: unsplit
    monkeypatch.setattr(distributed, "warmup_chunks", lambda falls: 0)
    split(unsplit_without_window=True)
    assert [name for name, _ in kernel_launches] == [first] + [state_pass] * 3
    assert list(distributed.WARMUP_WINDOWS.values()) == [0]
    kernel_launches.clear()                         # remembered: no window launched, the unsplit pass at once
    o, ht = split(unsplit_without_window=True)
    assert [name for name, _ in kernel_launches] == [first, state_pass]
    assert kernel_launches[1][1]["initial_state"] and o.shape == v.shape and ht.shape == (2, 2, 64, 64)


@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "ragged_runs"])
def test_scalar_gate_windows_where_they_lie(kernel_launches, monkeypatch, ragged):
    """GDN's split by the scalar-gate pass: the window pass reads the runs where they lie (``first_chunk``, no
    copies of ``q, k, v, Tb``), writes its ends one run on in the buffer whose first run of each sequence then takes
    ``h0``, and its outputs into the buffer that the pass over the runs writes whole."""
    from kda import distributed, gated_delta
    from kda.kernels import build

    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
    monkeypatch.setattr(distributed, "SCALAR_GATE_SPLIT", True)
    monkeypatch.setattr(distributed, "WARMUP_WINDOWS", {})
    monkeypatch.setattr(distributed, "window_serves", lambda *args: torch.tensor(True))
    arguments, stand_in = [], build.compile_program
    monkeypatch.setattr(build, "compile_program", lambda fn, out_idx, **params: (
        lambda launch: lambda *args: arguments.append(args) or launch(*args))(stand_in(fn, out_idx, **params)))
    monkeypatch.setattr(distributed, "RAGGED_RUNS", ragged)
    q, k, v, g, beta = level5_inputs(B=2, T=256, per_channel=False)
    k = (k.float() / k.float().norm(dim=-1, keepdim=True)).to(k.dtype)
    h0 = torch.randn(2, 2, 64, 64)
    o, ht = distributed._split_forward_cuda(q, k, v, g[..., 0], beta, 2, 128, 0.125, h0, True, False, warmup=True)
    window, runs = arguments[1], arguments[2]                 # q, k, v, Tb, G, scale, first_chunk, h0, o, ht, ...
    assert window[6] == 1 and runs[6] == 0                    # the last of each run's two chunks; all of them
    assert window[0].data_ptr() == q.data_ptr()
    assert window[0].shape == ((2, 256, 2, 64) if ragged else (4, 128, 2, 64))
    assert window[8].data_ptr() == runs[8].data_ptr() == o.data_ptr()
    assert window[9].data_ptr() == runs[7][1:].data_ptr()     # run r's window end is run r + 1's start
    assert torch.equal(runs[7][0], h0[0]) and torch.equal(runs[7][2], h0[1])


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_op_split_route(kernel_launches, monkeypatch, op):
    """``SPLIT_IN_OP``'s route (``op_split``): nothing where its rule does not split; where it does, the split with
    warm-up starts, GDN by the scalar-gate pass (its own path would be level 5's for want of blocks), the values
    checked by the first kernel (its flags, three with the keys) and read back after the passes: a flag raises the
    host check's error, naming the value."""
    from kda import distributed, gated_delta, validate

    monkeypatch.setattr(distributed, "WARMUP_STARTS", True)
    monkeypatch.setattr(distributed, "WARMUP_WINDOWS", {})
    monkeypatch.setattr(distributed, "window_serves", lambda *args: torch.tensor(True))
    q, k, v, g, beta = level5_inputs(B=1, T=128 * 64 * 2, per_channel=op == "kda")   # two runs of 128 chunks
    k = (k.float() / k.float().norm(dim=-1, keepdim=True)).to(k.dtype)
    g = g if op == "kda" else g[..., 0]
    args = (0.125, None, True, False)
    assert distributed.op_split(q[:, :8192], k[:, :8192], v[:, :8192], g[:, :8192], beta[:, :8192], *args,
                                True) is None            # 128 chunks: one run
    assert distributed.op_split(q, k, v, g, beta, *args, True) is None    # 256 chunks of 2 heads: too short a call
    assert not kernel_launches
    monkeypatch.setattr(distributed, "OP_SPLIT_MIN_CHUNKS", 256)
    o, ht = distributed.op_split(q, k, v, g, beta, *args, True)
    names = ["chunk_intra", "gated_state_output_pass"] if op == "kda" else ["chunk_gated_inverse",
                                                                            "inverse_state_output_pass"]
    assert [name for name, _ in kernel_launches] == names[:1] + names[1:] * 2
    if op == "gdn":                                   # both passes over batches of dense runs
        assert [params["varlen"] for _, params in kernel_launches[1:]] == [False, False]
    assert kernel_launches[0][1].get("check_keys")                   # the keys raw: checked with the gate and beta
    assert o.shape == v.shape and ht.shape == (1, 2, 64, 64)
    made, zeroed = [], gated_delta.first_kernel_flags
    flagged = lambda *a: made.append(zeroed(*a)) or made[-1].index_fill_(0, torch.tensor([1]), 1)   # beta's flag
    monkeypatch.setattr(gated_delta, "first_kernel_flags", flagged)
    with pytest.raises(ValueError, match="beta"):                   # the stand-in kernel cannot flag: set as it would
        distributed.op_split(q, k, v, g, beta + 1, *args, True)
    assert len(made) == 1 and made[0].numel() == 3
    monkeypatch.setattr(gated_delta, "first_kernel_flags", zeroed)
    kernel_launches.clear()
    distributed.op_split(q, k, v, g, beta, 0.125, None, True, True, True)        # keys normalized: no key check
    assert not kernel_launches[0][1].get("check_keys")
    monkeypatch.setattr(distributed, "SPLIT_GROUPED_VALUES", False)
    assert distributed.op_split(q[:, :, :1], k[:, :, :1], v, g, beta, *args, True) is None   # grouped: off
    monkeypatch.setattr(distributed, "SPLIT_GROUPED_VALUES", True)
    monkeypatch.setattr(validate, "runs_kernels", lambda where: True)       # CUDA's route: no repeat of q and k
    kernel_launches.clear()                           # grouped value heads: one key head for two value heads,
    o, ht = distributed.op_split(q[:, :, :1], k[:, :, :1], v, g, beta, *args, True)   # read by the kernels
    assert o.shape == v.shape and ht.shape == (1, 2, 64, 64)
    assert [name for name, _ in kernel_launches] == names[:1] + names[1:] * 2
    grouped = [params.get("value_groups", 1) for _, params in kernel_launches]
    assert grouped == ([2, 2, 2] if op == "gdn" else [2, 1, 1])   # KDA's pass reads chunk_intra's per-value forms
    monkeypatch.setattr(distributed, "WARMUP_STARTS", False)
    assert distributed.op_split(q, k, v, g, beta, *args, True) is None


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "scalar"])
@pytest.mark.parametrize("with_state", [False, True], ids=["stateless", "states"])
def test_level3(kernel_launches, per_channel, with_state):
    from kda.gated import _run_gated_kernels

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 130, 2, 64, generator=gen).bfloat16() for _ in range(3))
    g = -torch.rand((2, 130, 2, 64) if per_channel else (2, 130, 2), generator=gen)
    h0 = torch.randn(2, 2, 64, 64) if with_state else None
    o, ht = _run_gated_kernels(q, k, v, g, per_channel, 0.125, h0, with_state)
    assert o.shape == v.shape and (ht is not None) == with_state


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "scalar"])
def test_level3_checks_the_flags_once_the_pass_is_queued(kernel_launches, per_channel):
    """Both gate kinds: the first kernel sets the flags, the pass is launched, then the check reads
    the flags (``validate.launch_then_check``), and a check that raises stops the call."""
    from kda.gated import _run_gated_kernels

    q, k, v = (torch.randn(1, 64, 1, 64).bfloat16() for _ in range(3))
    g = -torch.rand((1, 64, 1, 64) if per_channel else (1, 64, 1))
    _run_gated_kernels(q, k, v, g, per_channel, 0.125, None, False,
                       check=lambda flags: kernel_launches.append(("check", flags)))
    first, second = ("chunk_intra", "seq_in_loop_per_channel") if per_channel else ("chunk_cumsum", "seq_in_loop_scalar")
    assert [name for name, _ in kernel_launches] == [first, second, "check"]

    def refuse(flags):
        raise ValueError("flagged")
    kernel_launches.clear()
    with pytest.raises(ValueError, match="flagged"):
        _run_gated_kernels(q, k, v, g, per_channel, 0.125, None, False, check=refuse)


@pytest.mark.parametrize("with_state", [False, True], ids=["stateless", "states"])
def test_levels_1_2_and_4(kernel_launches, monkeypatch, with_state):
    """The public functions of levels 1, 2 and 4 as on CUDA: levels 1 and 2 take level 3's scalar
    pass, without a gate and with its constant decay."""
    import kda
    from kda import validate

    monkeypatch.setattr(validate, "runs_kernels", lambda device: True)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 130, 2, 64, generator=gen).bfloat16() for _ in range(3))
    h0 = torch.randn(2, 2, 64, 64) if with_state else None
    kda.linear_attention(q, k, v, initial_state=h0, output_final_state=with_state)
    kda.decay_attention(q, k, v, torch.tensor([0.9, 0.99]), initial_state=h0, output_final_state=with_state)
    kda.delta_rule(q, k, v, torch.rand(2, 130, 2, generator=gen), initial_state=h0, output_final_state=with_state,
                   check_values=False)
    assert [name for name, _ in kernel_launches] == ["seq_in_loop_scalar", "seq_in_loop_scalar", "chunk_wy",
                                                     "state_output_pass"]
    assert [params["gate"] for _, params in kernel_launches[:2]] == ["none", "constant"]
    assert kernel_launches[0][1]["initial_state"] == with_state


@pytest.mark.parametrize("broken", ["missing", "strided", "float64", "rebinds"])
def test_the_stand_in_refuses_what_the_binder_refuses(kernel_launches, broken):
    """The check is not a stand-in that accepts anything: an argument left out, a strided view, a
    float64 tensor where float32 is declared, and a size that binds a symbol twice differently."""
    from kda.kernels.gated_state_pass import gated_state_output_pass
    from kda.kernels.build import compile_program

    q, k, v, g, beta = level5_inputs(T=128)
    Qw, Kw, W, U = (torch.empty_like(x) for x in (q, k, q, v))
    decay, A = torch.empty(1, 2, 2, 64), torch.empty(1, 128, 2, 64, dtype=q.dtype)
    launch = compile_program(gated_state_output_pass, (), DK=64, DV=64, initial_state=True, final_state=True)
    h0, o, ht = torch.zeros(1, 2, 64, 64), torch.empty_like(v), torch.empty(1, 2, 64, 64)
    no_table = torch.empty(1, dtype=torch.int32)
    args = [Qw, Kw, W, U, A, decay, h0, o, ht, no_table, no_table, no_table]
    launch(*args)                                                       # as the package calls it
    if broken == "missing":
        args.pop(6)
    elif broken == "strided":
        args[0] = torch.empty(1, 128, 2, 128, dtype=q.dtype)[..., :64]
    elif broken == "float64":
        args[5] = decay.double()
    else:
        args[1] = torch.empty(1, 64, 2, 64, dtype=q.dtype)               # T bound to 128 by Qw
    with pytest.raises(AssertionError):
        launch(*args)


@pytest.mark.parametrize("kind", ["dense", "packed", "pooled"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_decode(kernel_launches, per_channel, kind):
    """``fused_recurrent``: one step for a batch of 3 (dense), 3 packed sequences of 1, 2 and 1
    tokens, and 3 sequences reading and writing a pool of 5 states by index."""
    from kda.kernels.decode import run_fused_recurrent

    B, T = (3, 1) if kind == "dense" else (1, 4)
    q, k, v, g, beta = level5_inputs(B=B, T=T, per_channel=per_channel)
    cu = torch.tensor([0, 1, 3, 4]) if kind != "dense" else None
    pool = torch.randn(5, 2, 64, 64)
    indices = torch.tensor([4, 0, 2]) if kind == "pooled" else None
    h0 = pool if kind == "pooled" else torch.randn(3, 2, 64, 64)
    run_fused_recurrent(q, k, v, g, beta, 0.125, h0, cu, indices, True)
    assert [name for name, _ in kernel_launches] == ["fused_recurrent"]
    kernel_launches.clear()                  # checked: the GPU's checks first, the kernel guarded, then the flags
    run_fused_recurrent(q, k, v, g, beta, 0.125, h0, cu, indices, True,
                        check=lambda flags: kernel_launches.append(("check", {"flags": flags.tolist()})))
    assert [name for name, _ in kernel_launches] == ["value_checks", "fused_recurrent", "check"]
    assert kernel_launches[1][1]["guarded"] and kernel_launches[0][1]["pooled"] == (kind == "pooled")


@pytest.mark.parametrize("switch, inputs_dtype, operands", [
    (None, torch.bfloat16, "bfloat16"), (None, torch.float16, "float16"), (None, None, "bfloat16"),
    (torch.float32, torch.float16, "float32")], ids=["bf16_inputs", "fp16_inputs", "no_inputs_dtype", "float32"])
@pytest.mark.parametrize("as_operands", [False, True], ids=["float32_states", "states_as_operands"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_backward_state_passes(kernel_launches, monkeypatch, per_channel, as_operands, switch, inputs_dtype,
                               operands):
    """``kda.backward.kernel_state_passes``: both kernels of ``kda.kernels.backward_states`` take the
    pieces in their head-major chunk layout (a tail chunk; a gate per head's decay widened to DK), their
    operands in the inputs' dtype where ``STATE_KERNELS_DTYPE`` is None, else in that dtype; with
    ``as_operands`` and half operands, the states in the operands' dtype and the reverse pass's decay terms
    (``chunk_decay_terms``), float32 operands keeping float32 states."""
    from kda import backward
    from kda.reference import backward as ref

    monkeypatch.setattr(backward, "STATE_KERNELS_DTYPE", switch)
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=per_channel)
    p = ref.chunk_pieces(q.float(), k.float(), v.float(), g if per_channel else g[..., 0], beta, 0.125, 64,
                         torch.float32)
    whole = {name: p[name] for name in backward.STATE_PIECES}
    dO = ref.to_chunks(torch.randn(2, 200, 2, 64), 64)
    S0 = torch.zeros(2, 2, 64, 64)
    S, dS, dh0, terms = backward.kernel_state_passes(whole, S0, dO, torch.zeros_like(S0), inputs_dtype,
                                                     as_operands)
    assert [name for name, _ in kernel_launches] == ["forward_states_pass", "reverse_state_pass"]
    assert [params["dtype"] for _, params in kernel_launches] == [operands, operands]
    assert S.shape == dS.shape == (2, 2, 4, 64, 64) and dh0.shape == S0.shape
    halves = as_operands and operands != "float32"
    assert [params.get("state_dtype", "float32") for _, params in kernel_launches] == [
        operands if halves else "float32"] * 2
    assert kernel_launches[1][1].get("chunk_decay_terms", False) is halves
    assert (terms is not None and terms.shape == (2, 2, 4, 64)) if halves else terms is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_chunk_kernel(kernel_launches, monkeypatch, dtype):
    """``kda.backward.chunk_kernel``'s route: ``chunked_gradients`` with ``CHUNK_KERNEL`` on (CUDA faked) runs
    the state passes by torch and the chunk stage as one launch of ``kda.kernels.backward_chunks`` with its
    arguments as the binder takes them (a tail chunk, a gate per head)."""
    from kda import backward

    monkeypatch.setattr(backward, "CHUNK_KERNEL", True)
    monkeypatch.setattr(backward, "FORWARD_PIECES", False)
    monkeypatch.setattr(backward, "STATE_KERNELS", False)
    monkeypatch.setattr(backward, "WALK_IDENTITIES", False)     # the earlier WY form first
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=False, dtype=dtype)
    do = torch.randn(2, 200, 2, 64)
    got = backward.chunked_gradients(q.float(), k.float(), v.float(), g[..., 0], beta, do, None, 0.125, None,
                                     kernel_dtype=dtype)
    assert [name for name, _ in kernel_launches] == ["chunk_gradients"]
    assert [x.shape for x in got[:5]] == [q.shape, k.shape, v.shape, g[..., 0].shape, beta.shape]
    assert not kernel_launches[0][1].get("identities")
    monkeypatch.setattr(backward, "WALK_IDENTITIES", True)      # the reverse walk's identities (the default)
    kernel_launches.clear()
    backward.chunked_gradients(q.float(), k.float(), v.float(), g[..., 0], beta, do, None, 0.125, None,
                               kernel_dtype=dtype)
    assert kernel_launches[0][1].get("identities") is True


@pytest.mark.parametrize("from_inputs", [False, True], ids=["level_pieces", "passes_from_inputs"])
@pytest.mark.parametrize("gate", ["none", "per_head"])
def test_level_backward_with_level_pieces(kernel_launches, monkeypatch, gate, from_inputs):
    """``LEVEL_PIECES`` on (CUDA faked), levels 1-3 without the delta rule: ``level_pieces`` makes the state
    passes' pieces, token-major, and the two state kernels compiled with ``token_major`` bind them, then the
    chunk kernel compiled without the delta rule (a tail chunk). ``passes_from_inputs``: with
    ``LEVEL_PASSES_FROM_INPUTS`` too, the state kernels compiled with ``gate_in`` bind the op's inputs and the
    cumulative gate instead."""
    from kda import backward

    for switch in ("STATE_KERNELS", "CHUNK_KERNEL", "TOKEN_MAJOR_STATES", "STATES_AS_OPERANDS", "LEVEL_PIECES"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "LEVEL_PASSES_FROM_INPUTS", from_inputs)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v, g, _ = level5_inputs(B=2, T=200, per_channel=False)
    gate_ = None if gate == "none" else g[..., 0]
    got = backward.chunked_gradients(q, k, v, gate_, None, torch.randn(2, 200, 2, 64).bfloat16(), None, 0.125, None,
                                     kernel_dtype=torch.bfloat16)
    assert [name for name, _ in kernel_launches] == ["forward_states_pass", "reverse_state_pass", "chunk_gradients"]
    params = dict(kernel_launches)
    for name in ("forward_states_pass", "reverse_state_pass"):
        assert params[name]["token_major"] and params[name]["delta_rule"] is False
        assert params[name].get("gate_in", False) is from_inputs
    assert params["chunk_gradients"]["delta_rule"] is False
    assert [x.shape for x in got[:3]] == [q.shape, k.shape, v.shape] and got[4] is None


@pytest.mark.parametrize("unverified", [False, True], ids=["earlier_glue", "with_the_run100_switches"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_backward_with_every_kernel(kernel_launches, monkeypatch, per_channel, unverified):
    """Every kernel switch on (CUDA faked), q, k, v and do in bf16 as the op hands them: the forward's
    ``chunk_intra`` makes the pieces, the two state kernels run on them, and the chunk kernel (a gate
    per head) or the three kernels for a gate per channel make the gradients; every launch as the
    binder takes it (a tail chunk). ``unverified``: with the four switches that landed off and went on after
    run 100's GPU tests (the state passes token-major and with the decay terms, ``chunk_pair_gradients`` with
    ``shared_pairs`` and the gate's inputs), ``SCORES_FROM_FORWARD``, ``PAIR_KERNEL_TWO_BLOCKS`` and
    ``PAIR_KERNEL_BY_CHANNELS``, and ``WALK_IDENTITIES`` (on since run 153); without them,
    the glue of before, still reachable by the switches."""
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL"):
        monkeypatch.setattr(backward, switch, True)
    for switch in ("STATES_AS_OPERANDS", "TOKEN_MAJOR_STATES", "SHARED_PAIR_SUMS", "GATE_IN_PAIR_KERNEL",
                   "SCORES_FROM_FORWARD", "PAIR_KERNEL_TWO_BLOCKS", "PAIR_KERNEL_BY_CHANNELS", "WALK_IDENTITIES"):
        monkeypatch.setattr(backward, switch, unverified)
    for switch in ("PAIR_PIECES_FROM_FORWARD", "INVERSE_FROM_FORWARD"):    # tested below
        monkeypatch.setattr(backward, switch, False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    # no torch stage runs, so the torch stages' memory budget (a query of the device) is not asked for
    monkeypatch.setattr(backward, "memory_budget", lambda *a: pytest.fail("the torch stages' budget was asked for"))
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=per_channel)
    gate = g if per_channel else g[..., 0]
    got = backward.chunked_gradients(q, k, v, gate, beta, torch.randn(2, 200, 2, 64).bfloat16(), None, 0.125, None,
                                     kernel_dtype=torch.bfloat16, final_dtype=unverified)
    step3 = ["chunk_pair_pieces", "chunk_state_gradients", "chunk_pair_gradients"] if per_channel else ["chunk_gradients"]
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "forward_states_pass", "reverse_state_pass", *step3]
    assert [x.shape for x in got[:5]] == [q.shape, k.shape, v.shape, gate.shape, beta.shape]
    params = dict(kernel_launches)
    assert params["reverse_state_pass"].get("chunk_decay_terms", False) is unverified
    assert params["forward_states_pass"].get("state_dtype", "float32") == ("bfloat16" if unverified else "float32")
    for name in ("forward_states_pass", "reverse_state_pass"):          # the forward's pieces as they are
        assert params[name].get("token_major", False) is unverified
    chunk = params["chunk_state_gradients" if per_channel else "chunk_gradients"]
    assert chunk.get("identities", False) is unverified                # WALK_IDENTITIES
    if not per_channel:                          # GRADS_IN_INPUT_DTYPE: dq, dk, dv bound in bf16
        assert params["chunk_gradients"].get("grad_dtype") == ("bfloat16" if unverified else None)
        assert {x.dtype for x in got[:3]} == {torch.bfloat16 if unverified else torch.float32}
    else:                                        # KDA: dv alone (dq, dk add up over two kernels)
        assert params["chunk_state_gradients"].get("grad_dtype") == ("bfloat16" if unverified else None)
        assert got[2].dtype == (torch.bfloat16 if unverified else torch.float32)
    if per_channel:
        assert params["chunk_pair_gradients"].get("shared_pairs", False) is unverified
        assert params["chunk_pair_gradients"].get("finish_gate", False) is unverified
        assert params["chunk_pair_pieces"].get("scores", True) is not unverified     # the forward's A_qk read
        assert params["chunk_pair_gradients"].get("min_blocks", 1) == (4 if unverified else 1)   # by channels
        assert params["chunk_pair_gradients"].get("block_dk") == (32 if unverified else None)


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_backward_with_the_forwards_pair_pieces(kernel_launches, monkeypatch, per_channel):
    """``PAIR_PIECES_FROM_FORWARD`` (KDA) and ``INVERSE_FROM_FORWARD`` (GDN) with every kernel (CUDA faked, a tail
    chunk): the forward's ``chunk_intra`` bound with ``backward_outputs`` (its three extra outputs after the chunk
    table); for KDA no ``chunk_pair_pieces``, ``chunk_state_gradients`` and ``chunk_pair_gradients`` bound to what
    it wrote; for GDN the chunk kernel bound with ``pieces_in`` (``T``, ``K K^T E`` and the scores after ``dS``)."""
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", "TOKEN_MAJOR_STATES",
                   "STATES_AS_OPERANDS", "PAIR_PIECES_FROM_FORWARD", "INVERSE_FROM_FORWARD"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=per_channel)
    gate = g if per_channel else g[..., 0]
    got = backward.chunked_gradients(q, k, v, gate, beta, torch.randn(2, 200, 2, 64).bfloat16(), None, 0.125, None,
                                     kernel_dtype=torch.bfloat16)
    step3 = ["chunk_state_gradients", "chunk_pair_gradients"] if per_channel else ["chunk_gradients"]
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "forward_states_pass", "reverse_state_pass", *step3]
    assert kernel_launches[0][1].get("backward_outputs") is True
    if not per_channel:
        assert kernel_launches[-1][1].get("pieces_in") is True
    assert [x.shape for x in got[:5]] == [q.shape, k.shape, v.shape, gate.shape, beta.shape]


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_backward_of_packed_sequences_with_the_state_kernels(kernel_launches, monkeypatch, per_channel):
    """``PACKED_STATE_KERNELS`` with every kernel (CUDA faked): packed sequences (an empty one, one token, tails)
    take one launch of each state kernel compiled with ``varlen``, bound with one initial state and final-state
    gradient per sequence and the chunk offsets, between the forward's ``chunk_intra`` and the chunk kernels."""
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNEL", "CHUNK_KERNELS_BY_CHANNEL", "TOKEN_MAJOR_STATES",
                   "STATES_AS_OPERANDS", "PACKED_STATE_KERNELS"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    bounds = [0, 70, 71, 71, 200]
    q, k, v, g, beta = level5_inputs(B=1, T=200, per_channel=per_channel)
    gate = g if per_channel else g[..., 0]
    N = len(bounds) - 1
    h0, dht = torch.randn(N, 2, 64, 64), torch.randn(N, 2, 64, 64)
    got = backward.op_gradients(q, k, v, gate, beta, 0.125, h0, False, torch.tensor(bounds),
                                torch.randn(1, 200, 2, 64).bfloat16(), dht)
    # the defaults: KDA's pair pieces and GDN's inverse from the forward's chunk_intra
    step3 = ["chunk_state_gradients", "chunk_pair_gradients"] if per_channel else ["chunk_gradients"]
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "forward_states_pass", "reverse_state_pass", *step3]
    params = dict(kernel_launches)
    assert params["forward_states_pass"]["varlen"] and params["reverse_state_pass"]["varlen"]
    assert [x.shape for x in got] == [q.shape, k.shape, v.shape, gate.shape, beta.shape, h0.shape]


@pytest.mark.parametrize("switches, want", [(("PAIRWISE_BY_PRODUCTS",), "products"),
                                             (("PAIRWISE_BY_HALVINGS",), "halvings"),
                                             (("PAIRWISE_BY_PRODUCTS", "PAIRWISE_BY_HALVINGS"), "halvings")],
                         ids=["products", "halvings", "both"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_level5_steep_chunk_switches(kernel_launches, monkeypatch, per_channel, switches, want):
    """``PAIRWISE_BY_PRODUCTS`` and ``PAIRWISE_BY_HALVINGS``: a gate per channel compiles ``chunk_intra`` with
    ``pairwise="products"`` or ``"halvings"`` (its steep chunks' diagonal blocks; the halvings where both are on),
    bound as the forward's; a gate per head has no pairwise path and keeps the default compile."""
    from kda import gated_delta
    from kda.gated_delta import _run_kernels
    from kda.kernels import chunk_intra

    for switch in switches:
        monkeypatch.setattr(chunk_intra, switch, True)
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS", False)          # it takes the place of them all (below)
    monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", False)
    q, k, v, g, beta = level5_inputs(B=2, per_channel=per_channel)
    o, _ = _run_kernels(q, k, v, g, beta, 0.125, None, torch.zeros(2, dtype=torch.int32), None, False)
    assert [name for name, _ in kernel_launches] == ["chunk_intra", "gated_state_output_pass"]
    assert kernel_launches[0][1].get("pairwise") == (want if per_channel else None)
    if per_channel:                                  # level 3's per-channel call takes the same compile
        from kda.gated import _run_gated_kernels

        kernel_launches.clear()
        _run_gated_kernels(q, k, v, g, True, 0.125, None, False)
        assert kernel_launches[0][0] == "chunk_intra" and kernel_launches[0][1].get("pairwise") == want


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_key_check_in_kernel(kernel_launches, per_channel, monkeypatch):
    """``KEY_CHECK_IN_KERNEL``: ``forward_eager`` on CUDA hands the kernels three value flags where it checks raw keys
    (not with ``use_qk_l2norm_in_kernel`` or ``check_values=False``, nor with the switch off), and
    ``chunk_intra`` (or GDN's ``chunk_gated_inverse``) is compiled with ``check_keys`` and bound so."""
    from kda import gated_delta, validate
    from kda.kernels.chunk_intra import prepare_chunks

    q, k, v, g, beta = level5_inputs(B=2, per_channel=True)
    prepare_chunks(q, k, v, g, beta, 0.125, torch.zeros(3, dtype=torch.int32))
    assert kernel_launches[-1][0] == "chunk_intra" and kernel_launches[-1][1].get("check_keys") is True
    prepare_chunks(q, k, v, g, beta, 0.125, torch.zeros(2, dtype=torch.int32))
    assert "check_keys" not in kernel_launches[-1][1]
    if not per_channel:                                 # the scalar-gate path: its first kernel checks them
        monkeypatch.setattr(gated_delta, "SCALAR_GATE_PATH", True)
        monkeypatch.setattr(gated_delta, "SCALAR_GATE_MIN_BLOCKS", 0.0)
        kernel_launches.clear()
        gated_delta._run_kernels(*level5_inputs(B=2, per_channel=False), 0.125, None, torch.zeros(3, dtype=torch.int32))
        assert [name for name, _ in kernel_launches] == ["chunk_gated_inverse", "inverse_state_output_pass"]
        assert kernel_launches[0][1].get("check_keys") is True
    seen = []

    def run_kernels(q, k, v, g, beta, scale, h0, flags=None, *args, **kwargs):
        seen.append(flags.numel())
        return torch.zeros_like(v), None

    monkeypatch.setattr(validate, "runs_kernels", lambda q: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(gated_delta, "_run_kernels", run_kernels)
    q, k, v, g, beta = level5_inputs(B=2, per_channel=per_channel)
    g = g if per_channel else g[..., 0]
    for on, options, want in ((True, {}, 3), (True, dict(use_qk_l2norm_in_kernel=True), 2),
                              (True, dict(check_values=False), 2), (False, {}, 2)):
        monkeypatch.setattr(gated_delta, "KEY_CHECK_IN_KERNEL", on)
        gated_delta.forward_eager(q, k, v, g, beta, None, None, False, options.get("use_qk_l2norm_in_kernel", False),
                                  None, per_channel, options.get("check_values", True))
        assert seen.pop() == want, (on, options)


def test_backward_pair_sums_by_products(kernel_launches, monkeypatch):
    """``PAIR_SUMS_BY_PRODUCTS`` (CUDA faked, KDA, every kernel): ``chunk_pair_gradients`` compiled with
    ``products`` and bound as without it."""
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNELS_BY_CHANNEL", "PAIR_SUMS_BY_PRODUCTS"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "PAIR_SUMS_BY_HALVINGS", False)      # on by default; it takes the products' place
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=True)
    backward.chunked_gradients(q, k, v, g, beta, torch.randn(2, 200, 2, 64).bfloat16(), None, 0.125, None,
                               kernel_dtype=torch.bfloat16)
    assert dict(kernel_launches)["chunk_pair_gradients"].get("products") is True


@pytest.mark.parametrize("products", [False, True], ids=["alone", "with_products"])
def test_backward_pair_sums_by_halvings(kernel_launches, products, monkeypatch):
    """``PAIR_SUMS_BY_HALVINGS`` (CUDA faked, KDA, every kernel): ``chunk_pair_gradients`` compiled with
    ``halve_to=PAIR_HALVINGS_TO``, in the place of the products where both switches are on, and bound as without it."""
    from kda import backward

    for switch in ("FORWARD_PIECES", "STATE_KERNELS", "CHUNK_KERNELS_BY_CHANNEL", "PAIR_SUMS_BY_HALVINGS"):
        monkeypatch.setattr(backward, switch, True)
    monkeypatch.setattr(backward, "PAIR_SUMS_BY_PRODUCTS", products)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v, g, beta = level5_inputs(B=2, T=200, per_channel=True)
    backward.chunked_gradients(q, k, v, g, beta, torch.randn(2, 200, 2, 64).bfloat16(), None, 0.125, None,
                               kernel_dtype=torch.bfloat16)
    params = dict(kernel_launches)["chunk_pair_gradients"]
    assert params.get("halve_to") == backward.PAIR_HALVINGS_TO and "products" not in params


@pytest.mark.parametrize("steep", [False, True], ids=["default", "steep_for_activated"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("form", ["softplus", "sigmoid"])
def test_level5_activations_in_kernel(kernel_launches, form, packed, steep, monkeypatch):
    """``chunk_intra`` compiled with ``gate_act`` and ``beta_act`` (``ACTIVATIONS_IN_KERNEL``): the raw gate and
    beta bound as before, and the activations' ``A_log``, ``dt_bias`` and ``lower_bound`` after the chunk table,
    dense and packed; with ``STEEP_FOR_ACTIVATED_GATES`` compiled for steep chunks (the halvings, and the middles for
    the sigmoid form), the other switches off."""
    from kda.activation import Activation
    from kda.kernels import chunk_intra
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.packed import chunk_table

    monkeypatch.setattr(chunk_intra, "STEEP_FOR_ACTIVATED_GATES", steep)
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS", False)

    q, k, v, g, beta = level5_inputs(B=1 if packed else 2, per_channel=True)
    table = chunk_table([0, 70, 71, 200], "cpu") if packed else None
    act = Activation(form, "sigmoid", torch.randn(2), torch.randn(2, 64), -5.0 if form == "sigmoid" else 0.0)
    prepare_chunks(q, k, v, g.abs(), beta * 4 - 2, 0.125, torch.zeros(2, dtype=torch.int32), table, activation=act)
    name, params = kernel_launches[0]
    assert name == "chunk_intra" and params["gate_act"] == form and params["beta_act"] == "sigmoid"
    assert params["varlen"] is packed
    assert params.get("pairwise") == ("halvings" if steep else None)
    assert bool(params.get("middles")) == (steep and form == "sigmoid")
    kernel_launches.clear()                              # a plain call: the switch leaves it as it was
    prepare_chunks(q, k, v, -g.abs(), beta, 0.125, torch.zeros(2, dtype=torch.int32), table)
    assert "pairwise" not in kernel_launches[0][1] and "middles" not in kernel_launches[0][1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_capped_steps_switch(kernel_launches, monkeypatch, dtype):
    """``CAPPED_STEPS``: by default a bf16 call with a gate given activated or activated by softplus in the kernel
    (a layer's) compiles ``chunk_intra`` with ``pairwise="capped"``, safe_gate's sigmoid does not; with every gate
    form in ``CAPPED_STEPS_FOR``, every bf16 call with a gate per channel does (plain and activated, levels 3 and 5,
    dense and packed), in place of the halvings and the middles; the backward's forward (``backward_outputs``), fp16
    and a gate per head keep what they had."""
    from kda.activation import Activation
    from kda.kernels import chunk_intra
    from kda.kernels.chunk_intra import prepare_chunks
    from kda.packed import chunk_table

    q, k, v, g, beta = level5_inputs(B=1, per_channel=True, dtype=dtype)
    bf16 = dtype == torch.bfloat16
    flags = lambda: torch.zeros(2, dtype=torch.int32)
    for form, capped in (("softplus", bf16), ("sigmoid", False), (None, bf16)):            # the defaults
        kernel_launches.clear()
        act = Activation(form, "sigmoid", torch.randn(2), torch.randn(2, 64), -5.0 if form == "sigmoid" else 0.0)
        prepare_chunks(q, k, v, g if form else -g.abs(), beta, 0.125, flags(), activation=act if form else None)
        assert (kernel_launches[0][1].get("pairwise") == "capped") == capped, form
    monkeypatch.setattr(chunk_intra, "CAPPED_STEPS_FOR", (None, "softplus", "sigmoid"))
    act = Activation("sigmoid", "sigmoid", torch.randn(2), torch.randn(2, 64), -5.0)
    calls = [dict(), dict(table=chunk_table([0, 70, 71, 200], "cpu")), dict(activation=act)]
    for extra in calls:
        kernel_launches.clear()
        prepare_chunks(q, k, v, -g.abs(), beta, 0.125, flags(), **extra)
        params = kernel_launches[0][1]
        assert params.get("pairwise") == ("capped" if bf16 else None), extra
        assert "middles" not in params or not bf16
    kernel_launches.clear()
    prepare_chunks(q, k, None, -g.abs(), None, 0.125, flags(), delta=False)           # level 3
    assert kernel_launches[0][1].get("pairwise") == ("capped" if bf16 else None)
    kernel_launches.clear()
    q, k, v, g, beta = level5_inputs(B=2, per_channel=True, dtype=dtype)
    prepare_chunks(q, k, v, -g.abs(), beta, 0.125, flags(), backward_outputs=True)
    assert kernel_launches[0][1].get("pairwise") != "capped"
    kernel_launches.clear()
    q, k, v, g, beta = level5_inputs(B=2, per_channel=False, dtype=dtype)
    prepare_chunks(q, k, v, -g.abs(), beta, 0.125, flags())                             # a gate per head
    assert "pairwise" not in kernel_launches[0][1]


def test_the_norm_kernel(kernel_launches, monkeypatch):
    """``L2NORM_KERNEL``: ``l2_normalized`` launches ``kda.kernels.norms.l2_normalize_rows`` on the rows of
    ``[B, T, H, D]`` seen as ``[B T H, D]``, the output in the input's dtype and shape."""
    from kda import gated_delta

    monkeypatch.setattr(gated_delta, "L2NORM_KERNEL", True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    x = torch.randn(2, 70, 3, 64).bfloat16()
    y = gated_delta.l2_normalized(x)
    assert kernel_launches == [("l2_normalize_rows", dict(D=64, dtype="bfloat16"))]
    assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("with_tail", [False, True], ids=["no_tail", "tail"])
def test_layer_kernels_launch(kernel_launches, with_tail):
    """``kda.kernels.causal_conv.causal_conv`` and ``kda.kernels.norms.gated_rms_normalized`` bind their arguments
    to their programs: ``x [B, T, C]`` with a ``[C, 1, W]`` weight and the previous tail (zeros without one), the
    norm over the rows of ``[B, T, H, D]`` with the gate's projection of the same shape; the channels per block
    divide ``C``."""
    from kda.kernels.causal_conv import causal_conv, conv_block
    from kda.kernels.norms import gated_rms_normalized

    x = torch.randn(2, 37, 192).bfloat16()
    tail = torch.randn(2, 192, 3).bfloat16() if with_tail else None
    y = causal_conv(x, torch.randn(192, 1, 4), tail)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert kernel_launches == [("causal_conv_silu", dict(C=192, W=4, dtype="bfloat16", block_c=64))]
    o, gate = torch.randn(2, 37, 3, 64).half(), torch.randn(2, 37, 3, 64).half()
    out = gated_rms_normalized(o, gate, torch.ones(64), 1e-6)
    assert out.shape == o.shape and out.dtype == o.dtype
    assert kernel_launches[1] == ("gated_rms_norm_rows", dict(D=64, dtype="float16"))
    assert [conv_block(c) for c in (4096, 192, 96, 8)] == [128, 64, 32, 8]
    with pytest.raises(ValueError, match="multiple of 8"):
        conv_block(100)


def test_layer_kernels_apply(monkeypatch):
    """``kda.layer.layer_kernels_apply``: with ``LAYER_KERNELS`` (on), CUDA half-precision inputs with nothing to
    differentiate take the kernels; the CPU, float32, a tensor that requires grad under autograd, or a trace by
    ``torch.compile`` keep torch's form (the kernels have no backward, and the compiler fuses torch's form itself)."""
    from kda import layer

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    x, w = torch.randn(2, 3).bfloat16(), torch.nn.Parameter(torch.randn(3))
    assert layer.LAYER_KERNELS                                   # on by default (run 136)
    assert not layer.layer_kernels_apply(x, w)                  # w requires grad, autograd on
    with torch.no_grad():
        assert layer.layer_kernels_apply(x, w)
        assert not layer.layer_kernels_apply(x.float(), w)
    assert layer.layer_kernels_apply(x, w.detach())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not layer.layer_kernels_apply(x, w.detach())
