"""The public functions: validate, then run the TileLang kernel (CUDA) or the chunked path (CPU).

Conventions (as in fla): tensors are ``[B, T, H, D]``; the state is ``[B, H, DK, DV]`` in
float32; ``q`` is multiplied by ``scale``, which defaults to ``DK ** -0.5`` as in fla's
``chunk_linear_attn`` and ``chunk_simple_gla``. Pass ``scale=1.0`` for the unscaled
recurrence of the articles.
"""

from __future__ import annotations

import functools
import math

import torch

from kda import cuda_autograd, validate
from kda.chunking import CHUNK_SIZE
from kda.reference import level1 as ref1
from kda.reference import level2 as ref2



# Measured on the H200 (results/tuning): a 32-wide value stripe gives B*H*DV/32 blocks for the
# 132 SMs and 32 state registers per thread, at the price of reading Q and K once per stripe;
# 16 re-computes Q K^T too often, 64 leaves SMs idle at B*H = 32. Three pipeline stages
# beat two by 1-3%.
KERNEL_CONFIG = {"chunk_size": CHUNK_SIZE, "block_dv": 32, "num_stages": 3, "threads": 128}

# The scalar pass's chunk slots and output warpgroups (kernels.linear_pass.seq_in_loop_scalar): run 61 in
# results/tuning, pass at (1, 32768, 32, 128): 0.561 ms with 4 slots and two output warpgroups taking
# alternate chunks, 0.566 with 2 slots, 0.693 before the split (one output group: 0.59 to 0.61, its
# outputs wrong then through shared bytes aliased across warpgroups, see build.WARP_SPECIALISED).
# Level 2 runs it too, with its constant decay (run 67: 0.421 ms with 4 slots, 0.536 with 2, 0.517 for
# level 2's own pipelined kernel, kernels.chapters.constant_decay.seq_in_loop), and level 1 without a gate (run 70: 0.402 ms
# against 0.469 for level 1's own pipelined kernel, kernels.chapters.linear_attention.seq_in_loop).
SCALAR_PASS_CONFIG = {"slots": 4, "out_groups": 2}


def dtype_name(dtype: torch.dtype) -> str:
    """The kernels' name of a half-precision torch dtype (their factories take strings)."""
    return {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]


# Tests set this to fill every output with NaN before a launch, so that an element the
# kernel fails to write shows up as NaN instead of as stale memory.
poison_outputs = False


def new_output(shape, dtype, device):
    """An output buffer for a kernel to fill: uninitialised, or NaN under ``poison_outputs``."""
    if poison_outputs:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def stand_in(rank: int, dtype, device) -> torch.Tensor:
    """A ``[1] * rank`` tensor for a kernel argument that the compiled variant never reads or writes
    (one signature for every variant of a kernel): one per rank, dtype and device, shared, so that
    a call allocates none."""
    return torch.empty((1,) * rank, dtype=dtype, device=device)


def state_arguments(h0, output_final_state, N, H, DK, DV, device):
    """The ``h0`` and ``ht`` a sequential pass takes (``kda.kernels.stages.state_shape``): ``h0`` in
    float32 or a stand-in, and a new ``[N, H, DK, DV]`` float32 buffer for the final state or a
    stand-in. A pass compiled without the state reads and writes no stand-in."""
    h0 = h0.to(torch.float32).contiguous() if h0 is not None else stand_in(4, torch.float32, device)
    ht = new_output((N, H, DK, DV), torch.float32, device) if output_final_state else stand_in(4, torch.float32, device)
    return h0, ht


def _run_kernel(program_fn, q, k, v, extra, scale, h0, output_final_state, **config):
    """Compile (once per head sizes, dtype, state flags and ``config``) and launch a sequence-in-loop
    kernel; returns ``o`` and the final state (``None`` without ``output_final_state``)."""
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV = v.shape[-1]
    kernel = compile_program(program_fn, out_idx=(), DK=DK, DV=DV, dtype=dtype_name(q.dtype),
                             initial_state=h0 is not None, final_state=output_final_state, **config)
    q, k, v = (x.contiguous() for x in (q, k, v))
    with torch.cuda.device(q.device):
        o = new_output((B, T, H, DV), q.dtype, q.device)
        h0, ht = state_arguments(h0, output_final_state, B, H, DK, DV, q.device)
        kernel(q, k, v, *extra, scale, h0, o, ht)
    return o, (ht if output_final_state else None)


@functools.lru_cache(maxsize=64)
def _log2_alpha_on(values: tuple, device: str) -> torch.Tensor:
    """``log2(alpha)`` as the kernel reads it, copied to the device once per set of decays:
    a copy from pageable host memory on every call would make the host wait for the GPU."""
    return torch.log2(torch.tensor(values, dtype=torch.float64)).to(device, torch.float32)


def finish(o, final, output_final_state):
    """What the level 1-4 functions return: ``o``, or ``(o, final)`` when the final state is asked."""
    return (o, final) if output_final_state else o


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
    with cuda_autograd.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    if validate.runs_kernels(q):
        from kda.kernels.linear_pass import seq_in_loop_scalar        # the pass without a gate (see above)

        no_w, no_gate = stand_in(4, q.dtype, q.device), stand_in(1, torch.float32, q.device)
        run = lambda q, k, v, h0: _run_kernel(seq_in_loop_scalar, q, k, v, (no_w, no_gate), scale, h0,
                                              output_final_state, gate="none", chunk_size=CHUNK_SIZE,
                                              block_dv=KERNEL_CONFIG["block_dv"], **SCALAR_PASS_CONFIG)
        o, final = cuda_autograd.level_call(run, q, k, v, None, None, h0, scale) if differentiable else run(q, k, v, h0)
    else:
        o, final = ref1.chunked(q.double() * scale, k, v, CHUNK_SIZE, h0, output_final_state)
        o, final = o.to(q.dtype), (final.float() if final is not None else None)
    return finish(o, final, output_final_state)
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
    with cuda_autograd.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        a = validate.check_alpha(alpha, H)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
    if validate.runs_kernels(q):
        from kda.kernels.linear_pass import seq_in_loop_scalar        # the pass, its gate constant (see above)

        log2_alpha = _log2_alpha_on(a, str(q.device))
        no_w = stand_in(4, q.dtype, q.device)
        run = lambda q, k, v, h0: _run_kernel(seq_in_loop_scalar, q, k, v, (no_w, log2_alpha), scale, h0,
                                              output_final_state, gate="constant", chunk_size=CHUNK_SIZE,
                                              block_dv=KERNEL_CONFIG["block_dv"], **SCALAR_PASS_CONFIG)
        if differentiable:                                 # the backward's gate: ln(a) at every token
            g = (log2_alpha * math.log(2)).expand(B, T, H).contiguous()
            o, final = cuda_autograd.level_call(run, q, k, v, g, None, h0, scale)
        else:
            o, final = run(q, k, v, h0)
    else:
        o, final = ref2.chunked(q.double() * scale, k, v, torch.tensor(a, dtype=torch.float64), CHUNK_SIZE, h0,
                                output_final_state)
        o, final = o.to(q.dtype), (final.float() if final is not None else None)
    return finish(o, final, output_final_state)
# --8<-- [end:decay_attention]
