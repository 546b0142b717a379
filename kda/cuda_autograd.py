"""CUDA calls that need gradients. For ``chunk_kda`` and ``chunk_gated_delta_rule``: whether a call is
differentiated (``differentiates``), the context of its input checks, the switch that lets such calls
through (``DEVICE_BACKWARD``), and the CUDA kernel of the backward op ``kda::chunk_gated_delta_backward``,
which runs ``kda.backward``. For the level 1-4 functions: ``LevelGradients``, their kernels' forward and
the same backward stages with no gate or no delta rule (``LEVEL_BACKWARD``). ``kda.backward`` is
imported only when a gradient is taken, so the forward's records and timings do not depend on the
backward's code (an edit of it re-made five GPU records once).
"""

from __future__ import annotations

import torch

from kda import custom_ops, validate  # noqa: F401  (custom_ops defines the backward op registered below)

# CUDA: gradients for chunk_kda and chunk_gated_delta_rule by kda.backward. On since its GPU tests
# passed (tests/test_gpu_backward.py, run 91: 74 of 74); with it off, an input that requires grad on
# CUDA is refused.
DEVICE_BACKWARD = True


def wanting_gradients(q, **others) -> list[str]:
    """The names of a CUDA call's tensors that require grad while grad mode is on (none on the CPU,
    where autograd differentiates the float64 path itself)."""
    if not (torch.is_grad_enabled() and validate.runs_kernels(q)):
        return []
    return [name for name, t in {"q": q, **others}.items() if isinstance(t, torch.Tensor) and t.requires_grad]


def differentiates(q, **others) -> bool:
    """Whether a CUDA call of ``chunk_kda`` / ``chunk_gated_delta_rule`` will be differentiated: then
    it goes through the op ``kda::chunk_gated_delta``, whose CUDA backward is below. With the switch
    off, an input that requires grad there is refused, naming the switch."""
    wanting = wanting_gradients(q, **others)
    if wanting and not DEVICE_BACKWARD:
        raise ValueError(f"{wanting[0]} requires grad, but the CUDA backward is switched off: call under "
                         f"torch.no_grad() or torch.inference_mode(), or run on CPU tensors (float64, "
                         f"differentiable); or set kda.cuda_autograd.DEVICE_BACKWARD = True to differentiate it "
                         f"by kda.backward")
    return bool(wanting)


@torch.library.register_kernel("kda::chunk_gated_delta_backward", "cuda")
def cuda_gradients(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                   cu_seqlens_cpu, do, dfinal):
    """The CUDA implementation of ``kda::chunk_gated_delta``'s backward op (``kda.custom_ops``; its
    CPU one differentiates the float64 forward): ``kda.backward.op_gradients``, where the switch is on."""
    from kda import backward, cuda_paths

    cuda_paths.require(cuda_paths.by_name("chunk_backward"), "the backward of chunk_kda and chunk_gated_delta_rule")
    grads = backward.op_gradients(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, do,
                                  dfinal if output_final_state else None, cu_seqlens_cpu=cu_seqlens_cpu)
    return [x.contiguous() for x in grads]              # as the op's fake has them


# CUDA: gradients of the level 1-4 functions (linear_attention, decay_attention, gated_attention, delta_rule)
# by kda.backward's stages with no gate or no delta rule, their forward by the levels' own kernels. The delta
# rule takes every backward kernel (a zero gate per head); levels 1-3 the state-pass kernels and the chunk
# kernels compiled without the delta rule. On since its GPU tests passed on the H200 (run 98,
# tests/test_gpu_backward.py).
LEVEL_BACKWARD = True


def level_differentiates(q, **others) -> bool:
    """Whether a CUDA call of a level 1-4 function will be differentiated: one of its tensors requires
    grad while grad mode is on. Such a call needs ``LEVEL_BACKWARD`` (``kda.cuda_paths``), and refuses
    with its name while the switch is off."""
    wanting = wanting_gradients(q, **others)
    if wanting:
        from kda import cuda_paths

        cuda_paths.require(cuda_paths.by_name("level_backward"), f"{wanting[0]} requiring grad")
    return bool(wanting)


# --8<-- [start:level_gradients]
class LevelGradients(torch.autograd.Function):
    """A level 1-4 call on CUDA that autograd can differentiate: ``run(q, k, v, h0)`` is the level's
    forward by its kernels (its own gate or ``beta`` inside); ``g`` and ``beta`` are what the backward
    sees: the log decay per token ``[B, T, H(, DK)]`` (level 2's constant one, spread out) or ``None``,
    and the delta rule's step sizes or ``None``. Gradients flow to ``q, k, v, g, beta, h0`` where they
    are tensors that require grad."""

    @staticmethod
    def forward(ctx, run, scale, q, k, v, g, beta, h0):
        o, final = run(q, k, v, h0)
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, g, beta, h0)
        return o, final

    @staticmethod
    def backward(ctx, do, dfinal):
        from kda import backward

        q, k, v, g, beta, h0 = ctx.saved_tensors
        grads = backward.op_gradients(q, k, v, g, beta, ctx.scale, h0, False, None, do, dfinal)
        dq, dk, dv, dg, dbeta = grads[:5]
        dh0 = grads[5] if h0 is not None else None
        return None, None, dq, dk, dv, dg, dbeta, dh0
# --8<-- [end:level_gradients]


# --8<-- [start:level_dispatch]
def level_dispatch(q, k, v, h0, scale, output_final_state, kernels, reference, differentiable=False, g=None,
                   beta=None):
    """Where a level 1-4 call runs, in one place: on CUDA ``kernels(q, k, v, h0) -> (o, final)``, through
    ``LevelGradients`` where it is ``differentiable`` (``g`` and ``beta``: what its backward sees); on the CPU
    ``reference(q * scale in float64, k, v, h0)``, the chunked float64 path that autograd differentiates, its
    results in ``q``'s dtype and float32. Returns ``o``, or ``(o, final)`` with ``output_final_state``."""
    if validate.runs_kernels(q):
        o, final = LevelGradients.apply(kernels, scale, q, k, v, g, beta, h0) if differentiable else \
            kernels(q, k, v, h0)
    else:
        o, final = reference(q.double() * scale, k, v, h0)
        o, final = o.to(q.dtype), (final.float() if final is not None else None)
    return (o, final) if output_final_state else o
# --8<-- [end:level_dispatch]
