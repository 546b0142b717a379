"""Level 3 public function: linear attention with a per-token gate (scalar or per channel).

Same conventions as ``kda.ops`` (``[B, T, H, D]`` tensors, float32 ``[B, H, DK, DV]`` states,
``scale`` defaulting to ``DK ** -0.5``); on CUDA the TileLang kernels of
``kda.kernels.linear_pass`` (a gate per head) or ``kda.kernels.chunk_intra`` and
``kda.kernels.per_channel_pass`` (a gate per channel), on the CPU the chunked float64 reference.
"""

from __future__ import annotations

import torch

from kda import cuda_autograd, ops, validate
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.reference import level3 as ref3


def _run_gated_kernels(q, k, v, g, per_channel, scale, h0, output_final_state, check=None):
    """Scalar gate: the cumsum kernel, then the fused pass. Per-channel gate: level 5's intra-chunk
    kernel without the delta rule (``chunk_intra(delta=False)``), then the sequential pass. Both
    first kernels flag a gate out of range as they read it; ``check(flags)`` runs once the pass is
    queued (``validate.launch_then_check``: the read-back waits for the first kernel only). Returns
    ``o`` and the final state or ``None``."""
    from kda.kernels.chunk_intra import chunk_intra
    from kda.kernels.linear_pass import chunk_cumsum, seq_in_loop_scalar
    from kda.kernels.per_channel_pass import seq_in_loop_per_channel
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV = v.shape[-1]
    C = ops.KERNEL_CONFIG["chunk_size"]
    dtype, gate_dtype = ops.dtype_name(q.dtype), str(g.dtype).removeprefix("torch.")
    pass_config = dict(DK=DK, DV=DV, dtype=dtype, chunk_size=C, block_dv=ops.KERNEL_CONFIG["block_dv"],
                       initial_state=h0 is not None, final_state=output_final_state)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    with torch.cuda.device(q.device):
        flags = torch.zeros(2, dtype=torch.int32, device=q.device)
        if not per_channel:
            cumsum = compile_program(chunk_cumsum, (), D=1, chunk_size=C, gate_dtype=gate_dtype)
            G = torch.empty(B, H, ceildiv(T, C) * C, dtype=torch.float32, device=q.device)
            cumsum(g.view(B, T, H, 1), G.view(*G.shape, 1), flags)
            inputs = (q, k, v, ops.stand_in(4, q.dtype, q.device), G, scale)   # no W
            seq = compile_program(seq_in_loop_scalar, (), **pass_config, **ops.SCALAR_PASS_CONFIG)
        else:
            from kda import gated_delta                      # its switch of the steep chunks' sums

            intra = compile_program(chunk_intra, (), DK=DK, chunk_size=C, dtype=dtype, gate_dtype=gate_dtype,
                                    delta=False, **gated_delta.steep_chunks())
            Qw, Kw = ops.new_output(q.shape, q.dtype, q.device), ops.new_output(k.shape, k.dtype, k.device)
            decay = ops.new_output((B, H, ceildiv(T, C), DK), torch.float32, q.device)
            A = ops.new_output((B, T, H, C), q.dtype, q.device)
            # without the delta rule V, beta, W and U are stand-ins, and so is the table of packed chunks
            rows, beta_rows = ops.stand_in(4, q.dtype, q.device), ops.stand_in(3, torch.float32, q.device)
            intra(q, k, rows, g, beta_rows, scale, Qw, Kw, decay, A, rows, rows, flags,
                  ops.stand_in(2, torch.int32, q.device))
            inputs = (Qw, Kw, A, decay, v)
            seq = compile_program(seq_in_loop_per_channel, (), **pass_config,
                                  num_stages=ops.KERNEL_CONFIG["num_stages"], threads=ops.KERNEL_CONFIG["threads"])
        o = ops.new_output((B, T, H, DV), q.dtype, q.device)
        h0, ht = ops.state_arguments(h0, output_final_state, B, H, DK, DV, q.device)
        validate.launch_then_check(flags, lambda: seq(*inputs, h0, o, ht), check)
    return o, (ht if output_final_state else None)


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
    with cuda_autograd.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        on_cuda = validate.runs_kernels(q)              # where the first kernel checks the values
        per_channel = validate.check_gates(g, B, T, H, DK, q.device, check_values=check_values and not on_cuda)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    if on_cuda:
        check = (lambda flags: validate.raise_flagged_values(flags, g)) if check_values else None
        run = lambda q, k, v, h0: _run_gated_kernels(q, k, v, g, per_channel, scale, h0, output_final_state, check)
        o, final = cuda_autograd.level_call(run, q, k, v, g, None, h0, scale) if differentiable else run(q, k, v, h0)
    else:
        o, final = ref3.chunked(q.double() * scale, k, v, g, CHUNK_SIZE, h0, output_final_state)
        o, final = o.to(q.dtype), (final.float() if final is not None else None)
    return ops.finish(o, final, output_final_state)
# --8<-- [end:gated_attention]
