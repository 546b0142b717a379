"""Input checks for the public functions: every error names the argument and the expectation."""

from __future__ import annotations

import collections
import contextlib
import math
import numbers

import torch

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_HEAD_SIZES = (64, 128)


def runs_kernels(where) -> bool:
    """Whether tensors on ``where`` (a device, or the tensor ``q`` itself) take the TileLang kernels
    (CUDA) or the float64 chunked path (any other device): the one place that decides it, for the
    checks and for every op. The ops ask it first, so a ``q`` that is no tensor is refused here."""
    if isinstance(where, torch.Tensor):
        where = where.device
    elif not isinstance(where, (torch.device, str)):
        raise ValueError(f"q must be a torch.Tensor of shape [B, T, H, DK], got {type(where).__name__}")
    return torch.device(where).type == "cuda"


def no_backward_on_cuda(name: str, t) -> None:
    """For CUDA calls with no backward (the decode step, the single stages): an input that asks for gradients
    there gets an error instead of an output that silently has none. The chunked ops check their inputs under
    ``checks_allow_gradients`` and have a backward; the CPU path is differentiable."""
    if isinstance(t, torch.Tensor) and t.is_cuda and t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, but the CUDA kernels of this call have no backward: call under "
                         f"torch.no_grad() or torch.inference_mode(), or run on CPU tensors (float64, differentiable)")


def shape_of(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_qkv(q, k, v, grouped_values: bool = False) -> tuple[int, int, int, int, int]:
    """``q, k: [B, T, H, DK]``, ``v: [B, T, H, DV]``, one dtype, one device. Returns the sizes.
    With ``grouped_values`` ``v`` may have ``HV`` heads, a multiple of ``H`` (grouped value heads);
    the ``H`` returned is then ``HV``."""
    for name, t, last in (("q", q, "DK"), ("k", k, "DK"), ("v", v, "DV")):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [B, T, H, {last}], got {type(t).__name__}")
        no_backward_on_cuda(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, T, H, {last}], got shape {shape_of(t)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {shape_of(q)} [B, T, H, DK], got {shape_of(k)}")
    if grouped_values:
        if v.shape[:2] != q.shape[:2] or q.shape[2] == 0 or v.shape[2] % q.shape[2]:
            raise ValueError(f"v must be [B, T, HV, DV] with B, T = {tuple(q.shape[:2])} like q and HV a multiple "
                             f"of the H = {q.shape[2]} heads of q, got {shape_of(v)}")
    elif v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, DV] with B, T, H = {tuple(q.shape[:3])} like q, got {shape_of(v)}")
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    if min(B, T, H, DK, DV, v.shape[2]) == 0:
        raise ValueError(f"q and v must have no empty dimension, got q {shape_of(q)} and v {shape_of(v)}")
    H = v.shape[2] if grouped_values else H
    if not q.is_floating_point():
        raise ValueError(f"q, k, v must be a floating dtype (float16 or bfloat16 on CUDA), got q {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
    if runs_kernels(q.device):
        if q.dtype not in KERNEL_DTYPES:
            raise ValueError(f"q, k, v must be float16 or bfloat16 on CUDA, got {q.dtype}")
        for name, size in (("DK (last dim of q, k)", DK), ("DV (last dim of v)", DV)):
            if size not in KERNEL_HEAD_SIZES:
                raise ValueError(f"{name} must be one of {KERNEL_HEAD_SIZES} for the CUDA kernels, got {size}")
    elif q.dtype not in CPU_DTYPES:
        raise ValueError(f"q, k, v must be a floating dtype {CPU_DTYPES}, got {q.dtype}")
    return B, T, H, DK, DV


def check_scale(scale, DK: int) -> float:
    """``None`` means ``DK ** -0.5`` (fla's default); otherwise a finite positive number."""
    if scale is None:
        return DK ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite positive number or None (meaning DK**-0.5), got {scale!r}")
    return float(scale)


def check_floating(name: str, t, dims: str, shape: tuple, device, alternative: str = "") -> None:
    """``t`` a floating tensor of ``shape`` (``dims``: its axes, for the message) on ``device``, not a CUDA
    tensor asking for a backward; ``alternative``: what else the argument may be, for the message."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor {dims}{alternative}, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {dims} = {shape}, got {shape_of(t)}")
    if t.device != device:
        raise ValueError(f"{name} must be on the device of q ({device}), got {t.device}")
    no_backward_on_cuda(name, t)
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")


def check_initial_state(initial_state, B: int, H: int, DK: int, DV: int, device) -> torch.Tensor | None:
    if initial_state is None:
        return None
    check_floating("initial_state", initial_state, "[B, H, DK, DV]", (B, H, DK, DV), device, " or None")
    return initial_state


def check_alpha(alpha, H: int) -> tuple[float, ...]:
    """A number or ``[H]`` values in (0, 1], finite. Returns the ``H`` decays as floats.

    Checked in plain Python on host values (one small copy for a tensor), so the check costs
    microseconds and nothing is launched on the GPU.
    """
    if isinstance(alpha, bool):
        raise ValueError(f"alpha must be a number in (0, 1] or a tensor [H] of such numbers, got {alpha!r}")
    if isinstance(alpha, numbers.Real):
        values = [float(alpha)] * H
    elif isinstance(alpha, torch.Tensor) and alpha.is_floating_point() and alpha.dim() in (0, 1):
        if alpha.dim() == 1 and alpha.shape[0] != H:
            raise ValueError(f"alpha must have shape [H] = [{H}] (one decay per head), got {shape_of(alpha)}")
        if alpha.requires_grad and torch.is_grad_enabled():     # read on the host: no gradient would reach it
            raise ValueError("alpha requires grad, but decay_attention's decays are constants: pass alpha.detach(), "
                             "or learn them through gated_attention with g = log(alpha) at every token")
        values = alpha.detach().to("cpu", torch.float64).tolist()
        values = values * H if alpha.dim() == 0 else values
    else:
        what = f"tensor of shape {shape_of(alpha)} and dtype {alpha.dtype}" if isinstance(alpha, torch.Tensor) else type(alpha).__name__
        raise ValueError(f"alpha must be a number in (0, 1] or a floating tensor [H], got {what}")
    for a in values:
        if not math.isfinite(a):
            raise ValueError(f"alpha must be finite, got {alpha!r}")
        if not 0.0 < a <= 1.0:
            raise ValueError(f"alpha must lie in (0, 1] (a decay factor), got {a!r}")
    return tuple(values)


GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_gates(g, B: int, T: int, H: int, DK: int, device, check_values: bool = True) -> bool:
    """``g`` is the log of a decay: ``[B, T, H]`` (scalar per head) or ``[B, T, H, DK]`` (per
    key channel), finite and ``<= 0``. Returns ``True`` for per-channel gates.

    The value check reads the range of ``g`` back from the device, which waits for the GPU;
    ``check_values=False`` skips it for callers that produce ``g`` with a bounded function
    (``logsigmoid``, ``-softplus``), and then a bad value gives a wrong result, not an error.
    """
    if not isinstance(g, torch.Tensor):
        raise ValueError(f"g must be a tensor [B, T, H] or [B, T, H, DK], got {type(g).__name__}")
    if tuple(g.shape) not in ((B, T, H), (B, T, H, DK)):
        raise ValueError(f"g must have shape [B, T, H] = {(B, T, H)} (scalar gate) or [B, T, H, DK] = "
                         f"{(B, T, H, DK)} (per-channel gate), got {shape_of(g)}")
    if g.device != device:
        raise ValueError(f"g must be on the device of q ({device}), got {g.device}")
    no_backward_on_cuda("g", g)
    allowed = GATE_DTYPES if runs_kernels(device) else CPU_DTYPES
    if g.dtype not in allowed:
        raise ValueError(f"g must be one of {allowed} here, got {g.dtype}")
    if check_values:
        check_gate_range(g, *value_ranges(g)[0])
    return g.dim() == 4


def value_ranges(*tensors) -> list:
    """``(min, max)`` of each tensor, with one read-back from the device for all of them (each read
    waits for the GPU); NaN reaches both ends."""
    if not tensors:
        return []
    ends = torch.stack([torch.stack(torch.aminmax(t)).double() for t in tensors]).tolist()   # exact
    return [tuple(pair) for pair in ends]


def check_gate_range(g, low: float, high: float) -> None:
    """The error for gates whose range ``[low, high]`` (``value_ranges``) is not finite and ``<= 0``."""
    if not (low > float("-inf") and high <= 0):
        bad = g[~((g <= 0) & (g > float("-inf")))].flatten()[0].item()
        raise ValueError(f"g must be finite and <= 0 (the natural log of a decay in (0, 1]), "
                         f"found {bad!r}; pass check_values=False only for gates known to be in range")


def check_beta_range(low: float, high: float) -> None:
    """The error for ``beta`` whose range ``[low, high]`` (``value_ranges``) is not within ``[0, 1]``."""
    if not (low >= 0 and high <= 1):
        raise ValueError(f"beta must lie in [0, 1] (the step size of the delta rule), found values in "
                         f"[{low!r}, {high!r}]")


# beta ||k||^2 may pass 2 by this factor: rounding (unit keys rounded to bf16, with allow_neg_eigval's beta of 2)
KEY_NORM_SLACK = 1.02


def check_key_norms(k, beta) -> None:
    """The delta rule's stability bound: its update multiplies the state along ``k`` by ``1 - beta ||k||^2``, which
    leaves ``[-1, 1]`` once ``beta ||k||^2 > 2``, and the state then grows without bound (keys not normalized: the
    option ``use_qk_l2norm_in_kernel`` forgotten). Raises where it passes 2 by more than rounding
    (``KEY_NORM_SLACK``). ``k [B, T, HQ, DK]``, ``beta [B, T, H]`` (``H`` a multiple of ``HQ``: value head ``i``
    reads key head ``i // (H / HQ)``). One read-back. The norms are reduced as ``k`` is read (no widened copy of it:
    on CUDA in float32, well inside the slack; run 111 had the float64 copy cost about 1 ms at 131072 tokens)."""
    group = beta.shape[2] // k.shape[2]
    wide = torch.float32 if k.is_cuda else torch.float64
    norms = torch.linalg.vector_norm(k, dim=-1, dtype=wide).square()                   # [B, T, HQ]
    load = beta.to(wide) * norms.repeat_interleave(group, dim=2)                          # [B, T, H]
    worst = load.max().item() if load.numel() else 0.0
    if not worst <= 2 * KEY_NORM_SLACK:
        b, t, h = (int(i) for i in torch.nonzero(~(load <= 2 * KEY_NORM_SLACK))[0])
        raise ValueError(f"k: beta * ||k||^2 = {worst:.4g} > 2 (batch {b}, token {t}, value head {h}): the delta rule's "
                         f"update 1 - beta ||k||^2 leaves [-1, 1] there and the state diverges; normalize the keys "
                         f"(use_qk_l2norm_in_kernel=True, as fla's layers call it), or pass check_values=False")


def raise_flagged_gates(g) -> None:
    """After a kernel flagged a gate out of range: the error of the full value check."""
    check_gates(g, *g.shape[:3], g.shape[3] if g.dim() == 4 else 1, g.device)   # raises with the value
    raise ValueError("g must be finite and <= 0: the kernel found a value out of range")


def launch_then_check(flags, launch, check=None, defer=None) -> None:
    """Queue the last kernel, then check the first one's value flags: the flags are copied to
    pinned host memory behind the first kernel, ``launch()`` queues the state pass, and only then
    does the host wait, for the copy alone. The GPU never idles between the two kernels, and the
    caller goes on while the pass runs (run 66 in results/tuning: a read-back before the launch
    left the GPU idle 70 to 100 us per call). ``check(host_flags)`` raises on a flagged value; the
    pass then has written only outputs made for this call, which the error discards. ``defer(read)``:
    the host does not wait at all; ``read()`` (the wait for the copy, then ``check``) is handed to
    ``defer`` to call later (``kda.decode.DEFERRED_CHECKS``)."""
    if check is None or not flags.is_cuda:           # no check, or flags already on the host
        launch()
        if check is not None:
            check(flags)
        return
    host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
    host.copy_(flags, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(flags.device))    # the stream the copy went on
    launch()
    read = lambda: copied.synchronize() or check(host)
    if defer is not None:
        defer(read)
    else:
        read()


_SIDE_STREAMS: dict = {}       # a stream per device for check_beside


def check_beside(flags, checks, launch, check) -> None:
    """``checks()`` (a kernel that sets ``flags``) on a stream of its own beside ``launch()`` on the current one, then
    ``check(host_flags)``: the host waits for the checks' kernel and the flags' copy alone, and the GPU may run the
    two kernels side by side instead of one after the other (a tile kernel bound by its blocks' latency leaves room
    beside it). The side stream first waits for the current one (the inputs, the flags zeroed), and the host waits
    for it before returning, so no tensor it read is freed under it. On the CPU, one after the other."""
    if not flags.is_cuda:
        checks()
        launch()
        check(flags)
        return
    side = _SIDE_STREAMS.get(flags.device)
    if side is None:
        side = _SIDE_STREAMS[flags.device] = torch.cuda.Stream(flags.device)
    side.wait_stream(torch.cuda.current_stream(flags.device))
    host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
    copied = torch.cuda.Event()
    with torch.cuda.stream(side):
        checks()
        host.copy_(flags, non_blocking=True)
        copied.record(side)
    launch()
    copied.synchronize()
    check(host)


def raise_flagged_values(flags, g, beta=None) -> None:
    """After a first kernel that checks values (``chunk_cumsum``, ``chunk_intra``, ``chunk_wy``): the
    errors of the full value checks if it flagged a gate (``flags[0]``; ``g`` given) or a ``beta``
    (``flags[1]``; ``beta`` given) out of range. ``flags`` on the host (``launch_then_check``) or
    the device (one read-back)."""
    bad_gate, bad_beta = flags.tolist()
    if bad_gate:
        raise_flagged_gates(g)
    if bad_beta:
        check_beta(beta, *beta.shape, beta.device)              # raises with the range found
        raise ValueError("beta must lie in [0, 1]: the kernel found a value out of range")


def check_beta(beta, B: int, T: int, H: int, device, check_values: bool = True) -> None:
    """``beta [B, T, H]``, floating, on the device of ``q``, every value in ``[0, 1]``."""
    check_floating("beta", beta, "[B, T, H]", (B, T, H), device)
    if check_values:
        check_beta_range(*value_ranges(beta)[0])


def check_cu_seqlens(cu_seqlens, B: int, T: int, cu_seqlens_cpu=None, read_values: bool = True) -> tuple | None:
    """``None``, or the boundaries ``[0, ..., T]`` (non-decreasing integers) of the sequences
    packed along ``T`` of a batch of one. Returns them as a tuple of Python ints, read from the host copy
    ``cu_seqlens_cpu`` when the caller has one (no wait for the GPU; it is trusted to equal
    ``cu_seqlens``, as in fla), else from ``cu_seqlens``. ``read_values=False`` (under
    ``torch.compile``) checks the tensors only and returns ``None``."""
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("cu_seqlens_cpu is a host copy of cu_seqlens: pass cu_seqlens too")
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [N + 1], got "
                         f"{type(cu_seqlens).__name__ if not isinstance(cu_seqlens, torch.Tensor) else cu_seqlens}")
    if B != 1:
        raise ValueError(f"with cu_seqlens the batch size must be 1 (sequences packed along T), got B = {B}")
    if cu_seqlens_cpu is not None:
        if not isinstance(cu_seqlens_cpu, torch.Tensor) or cu_seqlens_cpu.device.type != "cpu" \
                or cu_seqlens_cpu.shape != cu_seqlens.shape or cu_seqlens_cpu.is_floating_point():
            raise ValueError(f"cu_seqlens_cpu must be an integer CPU tensor of the shape of cu_seqlens "
                             f"{tuple(cu_seqlens.shape)}, got {cu_seqlens_cpu!r}")
    if not read_values:
        return None
    bounds, ordered = _read_bounds(cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu)
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {list(bounds)}")
    if not ordered:
        raise ValueError(f"cu_seqlens must be non-decreasing, got {list(bounds)}")
    return bounds


# A model calls every layer with the same cu_seqlens tensor, and each read of a device tensor waits for
# the GPU: the values are read once per tensor and version (an in-place change makes a new version), and
# checked for order then. The tensor is kept with its values, so that its id cannot name another tensor while
# it is here. (Checked on every call, 8,192 boundaries took 0.44 ms of the host's time per call.)
_BOUNDS: collections.OrderedDict = collections.OrderedDict()
_BOUNDS_KEPT = 8


def read_bounds(cu_seqlens: torch.Tensor) -> tuple:
    """The values of ``cu_seqlens`` as a tuple of Python ints, read back once per tensor and version."""
    return _read_bounds(cu_seqlens)[0]


def _read_bounds(cu_seqlens: torch.Tensor) -> tuple[tuple, bool]:
    """``read_bounds``, and whether the values are non-decreasing (found once, with the read)."""
    key = (id(cu_seqlens), cu_seqlens._version)
    kept = _BOUNDS.get(key)
    if kept is not None and kept[0] is cu_seqlens:
        _BOUNDS.move_to_end(key)
        return kept[1:]
    bounds = tuple(cu_seqlens.tolist())
    _BOUNDS[key] = (cu_seqlens, bounds, all(a <= b for a, b in zip(bounds, bounds[1:])))
    while len(_BOUNDS) > _BOUNDS_KEPT:
        _BOUNDS.popitem(last=False)
    return _BOUNDS[key][1:]


def checks_allow_gradients(differentiable: bool):
    """The context of the input checks of a chunked op's call: the checks refuse a CUDA input that requires
    grad only while grad mode is on, and a call that goes through the op (``cuda_autograd.differentiates``) has a
    backward. Only the checks run in it, nothing that builds the graph."""
    return torch.no_grad() if differentiable else contextlib.nullcontext()


def check_gated_delta_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, per_channel: bool, check_values=True,
                 cu_seqlens_cpu=None, read_bounds=True, differentiable=False, keys_normalized=True):
    """Every argument checked (clear errors, nothing computed); returns ``scale`` as a float, the
    initial state or ``None``, and the ``cu_seqlens`` boundaries or ``None``. With
    ``check_values=False`` the values of ``g`` and ``beta`` are left to
    ``raise_flagged_values`` after the first kernel (``chunk_intra`` checks them as it
    reads them). ``read_bounds=False`` (under ``torch.compile``) leaves the boundaries on the
    device: the op reads them. ``differentiable``: a CUDA call that ``kda.backward`` differentiates
    (through the op), whose inputs may require grad."""
    with checks_allow_gradients(differentiable):
        B, T, H, DK, DV = check_qkv(q, k, v, grouped_values=True)   # H: the value heads
        if check_gates(g, B, T, H, DK, q.device, check_values=False) != per_channel:
            form = "[B, T, H, DK] (one gate per key channel)" if per_channel else "[B, T, H] (one gate per head)"
            raise ValueError(f"g must have shape {form} here, got {shape_of(g)}")
        check_beta(beta, B, T, H, q.device, check_values=False)
        if check_values:                                  # both ranges in one read-back
            gate_range, beta_range = value_ranges(g, beta)
            check_gate_range(g, *gate_range)
            check_beta_range(*beta_range)
        scale = check_scale(scale, DK)
        bounds = check_cu_seqlens(cu_seqlens, B, T, cu_seqlens_cpu, read_values=read_bounds)
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        h0 = check_initial_state(initial_state, N, H, DK, DV, q.device)
        if check_values and not keys_normalized:          # after every shape: the keys against the delta rule's bound
            check_key_norms(k, beta)
    return scale, h0, bounds


def raise_flagged_inputs(flags, g, beta, k) -> None:
    """``raise_flagged_values`` for the gate and ``beta`` (``flags[0]``, ``flags[1]``), then the keys
    (``flags[2]``, where the first kernel checked them: ``check_keys``): the host check's error, with the worst
    key and where (``check_key_norms``; ``beta`` activated)."""
    host = flags.cpu()                                          # one read-back for every flag
    raise_flagged_values(host[:2], g, beta)
    if len(host) > 2 and host[2]:
        check_key_norms(k, beta)                       # raises with the worst key found
        raise ValueError("k: the kernel found beta * ||k||^2 > 2, past the delta rule's bound; normalize the keys "
                         "(use_qk_l2norm_in_kernel=True)")
