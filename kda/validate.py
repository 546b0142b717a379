"""Input checks for the public functions: every error names the argument and the expectation."""

from __future__ import annotations

import math
import numbers

import torch

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_HEAD_SIZES = (64, 128)


def shape_of(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_qkv(q, k, v, grouped_values: bool = False) -> tuple[int, int, int, int, int]:
    """``q, k: [B, T, H, DK]``, ``v: [B, T, H, DV]``, one dtype, one device. Returns the sizes.
    With ``grouped_values`` ``v`` may have ``HV`` heads, a multiple of ``H`` (grouped value heads);
    the ``H`` returned is then ``HV``."""
    for name, t, last in (("q", q, "DK"), ("k", k, "DK"), ("v", v, "DV")):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [B, T, H, {last}], got {type(t).__name__}")
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
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
    if q.device.type == "cuda":
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


def check_initial_state(initial_state, B: int, H: int, DK: int, DV: int, device) -> torch.Tensor | None:
    if initial_state is None:
        return None
    if not isinstance(initial_state, torch.Tensor):
        raise ValueError(f"initial_state must be a tensor [B, H, DK, DV] or None, got {type(initial_state).__name__}")
    if tuple(initial_state.shape) != (B, H, DK, DV):
        raise ValueError(f"initial_state must have shape [B, H, DK, DV] = {(B, H, DK, DV)}, got {shape_of(initial_state)}")
    if initial_state.device != device:
        raise ValueError(f"initial_state must be on the device of q ({device}), got {initial_state.device}")
    if not initial_state.is_floating_point():
        raise ValueError(f"initial_state must be a floating tensor, got {initial_state.dtype}")
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
