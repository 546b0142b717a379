"""Level 5 public functions, shaped like fla 0.6.0's: ``chunk_kda`` (per-channel gate, KDA) and
``chunk_gated_delta_rule`` (scalar gate, GDN), with variable-length batches through ``cu_seqlens``.

The recurrence (fla's convention, state ``d_k x d_v``)::

    S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T (scale q_t)

This module has the CPU path (the float64 chunked reference of ``kda.reference.level0``, one
sequence at a time); the level-5 TileLang kernels are not written yet, so CUDA tensors get a
clear error instead of a silently slow path.
"""

from __future__ import annotations

import torch

from kda import validate
from kda.delta import validate_beta
from kda.gated import validate_gates
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4

CHUNK_SIZE = 64


def validate_cu_seqlens(cu_seqlens, B: int, T: int) -> list[int] | None:
    """``None``, or the boundaries ``[0, ..., T]`` (non-decreasing integers) of the sequences
    packed along ``T`` of a batch of one. Returns them as Python ints."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [N + 1], got "
                         f"{type(cu_seqlens).__name__ if not isinstance(cu_seqlens, torch.Tensor) else cu_seqlens}")
    if B != 1:
        raise ValueError(f"with cu_seqlens the batch size must be 1 (sequences packed along T), got B = {B}")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {bounds}")
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {bounds}")
    return bounds


def _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
             cu_seqlens, per_channel: bool):
    B, T, H, DK, DV = validate.check_qkv(q, k, v)
    if validate_gates(g, B, T, H, DK, q.device) != per_channel:
        form = "[B, T, H, DK] (one gate per key channel)" if per_channel else "[B, T, H] (one gate per head)"
        raise ValueError(f"g must have shape {form} here, got {validate._shape(g)}")
    validate_beta(beta, B, T, H, q.device)
    scale = validate.check_scale(scale, DK)
    bounds = validate_cu_seqlens(cu_seqlens, B, T)
    N = len(bounds) - 1 if bounds is not None else B
    h0 = validate.check_initial_state(initial_state, N, H, DK, DV, q.device)
    if q.device.type != "cpu":
        raise NotImplementedError("chunk_kda / chunk_gated_delta_rule run on CPU tensors only for now: the "
                                  "level-5 TileLang kernels have not landed yet")
    if use_qk_l2norm_in_kernel:
        q, k = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    q = q.double() * scale
    if bounds is None:
        o, final = ref0.chunked(q, k, v, g, beta, CHUNK_SIZE, h0, output_final_state)
    else:
        pieces, finals = [], []
        for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
            state = h0[n:n + 1] if h0 is not None else None
            if e == s:                                   # an empty sequence keeps its state
                pieces.append(v.new_zeros(1, 0, H, DV, dtype=torch.float64))
                finals.append(state[0].double() if state is not None else v.new_zeros(H, DK, DV, dtype=torch.float64))
                continue
            o_n, f_n = ref0.chunked(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], CHUNK_SIZE, state, True)
            pieces.append(o_n)
            finals.append(f_n[0])
        o, final = torch.cat(pieces, dim=1), torch.stack(finals)
    final = final.float() if output_final_state else None
    return o.to(v.dtype), final


# --8<-- [start:chunk_kda]
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """Kimi Delta Attention, forward. Arguments as in fla 0.6.0's ``chunk_kda``:

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]``, the per-channel forget gate in log space (``<= 0``, finite).
        beta: ``[B, T, H]``, in ``[0, 1]``.
        scale: multiplies ``q``; ``None`` means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` for ``N`` sequences (``N = B`` without ``cu_seqlens``).
        output_final_state: also return the float32 final states ``[N, H, K, V]``.
        use_qk_l2norm_in_kernel: L2-normalize ``q`` and ``k`` over the head dimension first.
        cu_seqlens: ``[N + 1]`` boundaries of the sequences packed along ``T`` (then ``B = 1``).

    Returns:
        ``(o, final_state)``: ``o [B, T, H, V]`` in the dtype of ``v``; ``final_state`` or ``None``.
    """
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens, per_channel=True)
# --8<-- [end:chunk_kda]


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """Gated DeltaNet (GDN), forward: ``chunk_kda`` with one gate per head, ``g [B, T, H]``.
    Arguments and results as in fla 0.6.0's ``chunk_gated_delta_rule``."""
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens, per_channel=False)
