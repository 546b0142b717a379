"""Level 3 public function: linear attention with a per-token gate (scalar or per channel).

Same conventions as ``kda.ops`` (``[B, T, H, D]`` tensors, float32 ``[B, H, DK, DV]`` states,
``scale`` defaulting to ``DK ** -0.5``); on CUDA the TileLang kernels of
``kda.kernels.linear_pass`` (a gate per head) or ``kda.kernels.chunk_intra`` and
``kda.kernels.per_channel_pass`` (a gate per channel), on the CPU the chunked float64 reference.
"""

from __future__ import annotations

import torch

from kda import cuda_autograd, validate
from kda.chunking import CHUNK_SIZE
from kda.reference import level3 as ref3


def _run_gated_kernels(q, k, v, g, per_channel, scale, h0, output_final_state, check=None):
    """Scalar gate: the cumsum kernel, then the warp-specialised pass. Per-channel gate: level 5's intra-chunk
    kernel without the delta rule (``prepare_chunks(..., delta=False)``), then the sequential pass. Both first
    kernels flag a gate out of range as they read it; ``check(flags)`` runs once the pass is queued
    (``validate.launch_then_check``: the read-back waits for the first kernel only). Returns ``o`` and the final
    state or ``None``."""
    from kda.kernels import linear_pass, per_channel_pass
    from kda.kernels.chunk_intra import prepare_chunks

    flags = torch.zeros(2, dtype=torch.int32, device=q.device)
    if per_channel:
        form = prepare_chunks(q, k, None, g.contiguous(), None, scale, flags, delta=False)
        start, o, ht = per_channel_pass.pass_launch(form, v, h0, output_final_state)
    else:
        G = linear_pass.gate_cumsum(g, flags)
        start, o, ht = linear_pass.pass_launch(q, k, v, scale, h0, output_final_state, gate="per_token", G=G)
    validate.launch_then_check(flags, start, check)
    return o, ht


# --8<-- [start:gated_attention]
def gated_attention(q, k, v, g, scale=None, initial_state=None, output_final_state=False, check_values=True):
    """Linear attention with a data-dependent decay per token: ``S_t = diag(exp g_t) S_{t-1}
    + k_t v_t^T``, ``o_t = S_t^T (scale * q_t)``.

    Args:
        g: the log decay, ``<= 0`` and finite. ``[B, T, H]``: one gate per token and head
            (Mamba2 / GDN style; fla ``chunk_simple_gla(g=...)``). ``[B, T, H, DK]``: one
            gate per key channel (GLA / KDA style; fla ``chunk_gla(g=...)``). float32,
            bfloat16 or float16 on CUDA; the kernels sum it in float32.
        check_values: check that ``g`` is finite and ``<= 0``: the first kernel (the cumsum for a
            scalar gate, ``chunk_intra`` for a per-channel one) sets a flag as it reads the
            gates, and the flag is read back once the second is queued (one wait, for the first).
        q, k, v, scale, initial_state, output_final_state: as in ``linear_attention``.

    Returns:
        ``o [B, T, H, DV]``, or ``(o, final_state)`` when ``output_final_state`` is true.
    """
    differentiable = cuda_autograd.level_differentiates(q, k=k, v=v, g=g, initial_state=initial_state)
    with validate.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        on_cuda = validate.runs_kernels(q)              # where the first kernel checks the values
        per_channel = validate.check_gates(g, B, T, H, DK, q.device, check_values=check_values and not on_cuda)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    check = (lambda flags: validate.raise_flagged_values(flags, g)) if check_values else None
    kernels = lambda q, k, v, h0: _run_gated_kernels(q, k, v, g, per_channel, scale, h0, output_final_state, check)
    reference = lambda q, k, v, h0: ref3.chunked(q, k, v, g, CHUNK_SIZE, h0, output_final_state)
    return cuda_autograd.level_dispatch(q, k, v, h0, scale, output_final_state, kernels, reference, differentiable,
                                        g=g)
# --8<-- [end:gated_attention]
