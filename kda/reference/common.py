"""Small helpers shared by the float64 references.

Tensors follow fla: ``[B, T, H, D]``. The state is stored as ``d_k x d_v``
(``S[b, h]`` has shape ``[DK, DV]``), the transpose of the papers' ``d_v x d_k``,
so that the read-out is ``o = q @ S`` and the update ``S += k^T v`` need no
transposed operands.
"""

from __future__ import annotations

import torch

from kda.chunking import ceildiv


def as_f64(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(torch.float64) for t in tensors)


def zero_state(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, _, H, DK = q.shape
    return torch.zeros(B, H, DK, v.shape[-1], dtype=torch.float64, device=q.device)


def repeat_to_value_heads(q: torch.Tensor, k: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped value heads (value head ``i`` reads query and key head ``i // (heads / H)``): ``q`` and ``k`` with
    a head per value head, themselves where they have as many already."""
    group = heads // q.shape[2]
    if group == 1:
        return q, k
    # a new axis after the heads, expanded and flattened: one plain copy each, the same tensor as repeat_interleave's
    # (which took 0.28 ms for a 16 MB bf16 copy on an H100 in run 122; this form is not timed yet)
    spread = lambda x: x.unsqueeze(3).expand(*x.shape[:3], group, x.shape[3]).reshape(*x.shape[:2], heads, x.shape[3])
    return spread(q), spread(k)


def start_state(q: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    if initial_state is None:
        return zero_state(q, v)
    return initial_state.to(torch.float64).clone()


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, T, H, D] -> [B, H, NC, C, D]``, zero-padding the last chunk."""
    B, T, H, D = x.shape
    NC = ceildiv(T, chunk_size)
    pad = NC * chunk_size - T
    if pad:
        x = torch.cat([x, x.new_zeros(B, pad, H, D)], dim=1)
    return x.permute(0, 2, 1, 3).reshape(B, H, NC, chunk_size, D)


def from_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """``[B, H, NC, C, D] -> [B, T, H, D]``, dropping the padding."""
    B, H, NC, C, D = x.shape
    return x.reshape(B, H, NC * C, D)[:, :, :T].permute(0, 2, 1, 3).contiguous()


def chunk_lengths(T: int, chunk_size: int, device) -> torch.Tensor:
    """Real length of every chunk: ``chunk_size`` except maybe the last (the tail)."""
    NC = ceildiv(T, chunk_size)
    starts = torch.arange(NC, device=device) * chunk_size
    return torch.clamp(T - starts, max=chunk_size)


def causal_mask(C: int, device) -> torch.Tensor:
    """Lower triangle including the diagonal: token i sees j <= i."""
    return torch.tril(torch.ones(C, C, dtype=torch.bool, device=device))
