"""Error metrics used by tests, tables and GPU checks."""

from __future__ import annotations

import torch


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN or inf anywhere in ``out`` gives NaN."""
    out = out.to(torch.float64)
    ref = ref.to(torch.float64).to(out.device)
    if not torch.isfinite(out).all():
        return float("nan")
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.to(torch.float64)
    ref = ref.to(torch.float64).to(out.device)
    return (out - ref).abs().max().item()
