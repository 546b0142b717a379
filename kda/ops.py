"""Levels 1 and 2's public functions: validate, then run the TileLang kernel (CUDA) or the chunked path (CPU).

Conventions (as in fla): tensors are ``[B, T, H, D]``; the state is ``[B, H, DK, DV]`` in
float32; ``q`` is multiplied by ``scale``, which defaults to ``DK ** -0.5`` as in fla's
``chunk_linear_attn`` and ``chunk_simple_gla``. Pass ``scale=1.0`` for the unscaled
recurrence of the articles.
"""

from __future__ import annotations

import functools
import math

import torch

from kda import cuda_autograd, launch, validate
from kda.chunking import CHUNK_SIZE
from kda.reference import level1 as ref1
from kda.reference import level2 as ref2


@functools.lru_cache(maxsize=64)
def _log2_alpha_on(values: tuple, device: str) -> torch.Tensor:
    """``log2(alpha)`` as the kernel reads it, copied to the device once per set of decays:
    a copy from pageable host memory on every call would make the host wait for the GPU."""
    return torch.log2(torch.tensor(values, dtype=torch.float64)).to(device, torch.float32)


# --8<-- [start:linear_attention]
def linear_attention(q, k, v, scale=None, initial_state=None, output_final_state=False):
    """Causal linear attention without normalisation: ``S_t = S_{t-1} + k_t v_t^T``,
    ``o_t = S_t^T (scale * q_t)``.

    Args:
        q, k: ``[B, T, H, DK]``; v: ``[B, T, H, DV]``. fp16 or bf16 on CUDA (DK, DV in
            {64, 128}); any float dtype and size on the CPU.
        scale: multiplies ``q``; ``None`` means ``DK ** -0.5`` (fla's default).
        initial_state: optional ``[B, H, DK, DV]`` state before the first token.
        output_final_state: also return the float32 state after the last token.

    Returns:
        ``o`` of shape ``[B, T, H, DV]`` in the dtype of ``q``, or ``(o, final_state)``
        when ``output_final_state`` is true. Same function as fla's
        ``chunk_linear_attn(..., normalize=False)``.
    """
    differentiable = cuda_autograd.level_differentiates(q, k=k, v=v, initial_state=initial_state)
    with validate.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    def kernels(q, k, v, h0):                              # the warp-specialised pass, no gate
        from kda.kernels.linear_pass import pass_launch
        return launch.launched(pass_launch(q, k, v, scale, h0, output_final_state, gate="none"))

    reference = lambda q, k, v, h0: ref1.chunked(q, k, v, CHUNK_SIZE, h0, output_final_state)
    return cuda_autograd.level_dispatch(q, k, v, h0, scale, output_final_state, kernels, reference, differentiable)
# --8<-- [end:linear_attention]


# --8<-- [start:decay_attention]
def decay_attention(q, k, v, alpha, scale=None, initial_state=None, output_final_state=False):
    """Linear attention with a constant decay per head: ``S_t = a S_{t-1} + k_t v_t^T``,
    ``o_t = S_t^T (scale * q_t)`` (RetNet / Lightning Attention form).

    Args:
        alpha: the decay ``a`` in (0, 1], a number or a tensor ``[H]`` (one per head).
            fla writes the same thing as ``g_gamma = log(alpha)`` in ``chunk_simple_gla``.
            The values are checked on the host: pass a float or a CPU tensor (a CUDA
            tensor works, but reading it back waits for the GPU on every call). A constant,
            not differentiable: to learn the decays, use ``gated_attention`` with ``g = log(alpha)``.
        q, k, v, scale, initial_state, output_final_state: as in ``linear_attention``.

    Returns:
        ``o [B, T, H, DV]``, or ``(o, final_state)`` when ``output_final_state`` is true.
    """
    differentiable = cuda_autograd.level_differentiates(q, k=k, v=v, initial_state=initial_state)
    with validate.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        a = validate.check_alpha(alpha, H)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    def kernels(q, k, v, h0):                              # the same pass, its gate constant
        from kda.kernels.linear_pass import pass_launch
        return launch.launched(pass_launch(q, k, v, scale, h0, output_final_state, gate="constant",
                                           G=_log2_alpha_on(a, str(q.device))))

    reference = lambda q, k, v, h0: ref2.chunked(q, k, v, torch.tensor(a, dtype=torch.float64), CHUNK_SIZE, h0,
                                                 output_final_state)
    # differentiated (on CUDA), the backward's gate: ln(a) at every token
    g = (_log2_alpha_on(a, str(q.device)) * math.log(2)).expand(B, T, H).contiguous() if differentiable else None
    return cuda_autograd.level_dispatch(q, k, v, h0, scale, output_final_state, kernels, reference, differentiable,
                                        g=g)
# --8<-- [end:decay_attention]
