"""The level-5 forward and decode as torch custom ops (namespace ``kda``), so that
``torch.compile(fullgraph=True)`` traces a layer that calls ``chunk_kda``,
``chunk_gated_delta_rule``, ``fused_recurrent_kda`` or ``fused_recurrent_gated_delta_rule``.

Under compilation the public functions check shapes, dtypes and devices as always, skip the
value checks that read tensors back to the host (a graph cannot hold them), and call an op
below, which runs the eager path inside the compiled graph. Each op has a fake implementation:
the output shapes, nothing computed. Importing ``kda`` registers them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from kda import decode, gated_delta


def _final_like(v: Tensor, q: Tensor, cu_seqlens: Optional[Tensor], output_final_state: bool) -> Tensor:
    """The final states ``[N, HV, K, V]`` float32, or an empty tensor when they were not asked for
    (an op returns tensors, not ``None``)."""
    if not output_final_state:
        return v.new_empty(0, dtype=torch.float32)
    N = v.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(N, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)


@torch.library.custom_op("kda::chunk_gated_delta", mutates_args=())
def chunk_gated_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
                      initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm: bool,
                      cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    o, final = gated_delta.forward_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
                                         cu_seqlens, g.dim() == 4, False, cu_seqlens_cpu)
    return o, (final if final is not None else v.new_empty(0, dtype=torch.float32))


@chunk_gated_delta.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens, cu_seqlens_cpu):
    return torch.empty_like(v), _final_like(v, q, cu_seqlens, output_final_state)


@torch.library.custom_op("kda::fused_recurrent", mutates_args=())
def fused_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
                    initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm: bool,
                    cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    o, final = decode._recurrent(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
                                 cu_seqlens, None, g.dim() == 4, False, cu_seqlens_cpu)
    return o, (final if final is not None else v.new_empty(0, dtype=torch.float32))


@fused_recurrent.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens, cu_seqlens_cpu):
    return torch.empty_like(v), _final_like(v, q, cu_seqlens, output_final_state)


@torch.library.custom_op("kda::fused_recurrent_pooled", mutates_args=("pool",))
def fused_recurrent_pooled(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, pool: Tensor,
                           ssm_state_indices: Tensor, use_qk_l2norm: bool, cu_seqlens: Optional[Tensor],
                           cu_seqlens_cpu: Optional[Tensor]) -> Tensor:
    o, _ = decode._recurrent(q, k, v, g, beta, scale, pool, False, use_qk_l2norm, cu_seqlens, ssm_state_indices,
                             g.dim() == 4, False, cu_seqlens_cpu)
    return o


@fused_recurrent_pooled.register_fake
def _(q, k, v, g, beta, scale, pool, ssm_state_indices, use_qk_l2norm, cu_seqlens, cu_seqlens_cpu):
    return torch.empty_like(v)
