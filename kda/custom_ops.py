"""The level-5 forward and decode as torch custom ops (namespace ``kda``), so that
``torch.compile(fullgraph=True)`` traces a layer that calls ``chunk_kda``,
``chunk_gated_delta_rule``, ``fused_recurrent_kda`` or ``fused_recurrent_gated_delta_rule``.

Under compilation the public functions check shapes, dtypes and devices as always, skip the
value checks that read tensors back to the host (a graph cannot hold them), and call an op
below, which runs the eager path inside the compiled graph. Each op has a fake implementation:
the output shapes, nothing computed (``_forward_op`` makes the two ops of that form). Outputs and gradients
are contiguous whatever the inputs' strides (a layer's convolution hands ``v`` over transposed), so that the
fakes' strides are the real ones. ``chunk_gated_delta`` and ``fused_recurrent`` also have a backward
(``register_autograd``), so that a compiled graph trains: on the CPU it recomputes the
float64 forward and takes autograd's gradients through it, exactly what an eager call gives. The
backward op of ``chunk_gated_delta`` has a CUDA kernel of its own, registered by ``kda.cuda_autograd``
(``kda.backward.op_gradients``, the path an eager CUDA call takes), so a compiled graph trains on
CUDA too; the CPU implementation below refuses CUDA tensors, which reach it only if that module was
never imported (its message predates the backward). ``fused_recurrent`` (decode) has no CUDA backward.
Importing ``kda`` registers them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor



def _final_like(v: Tensor, q: Tensor, cu_seqlens: Optional[Tensor], output_final_state: bool) -> Tensor:
    """The final states ``[N, HV, K, V]`` float32, or an empty tensor when they were not asked for
    (an op returns tensors, not ``None``)."""
    if not output_final_state:
        return v.new_empty(0, dtype=torch.float32)
    N = v.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(N, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)


def _forward_op(name: str, forward):
    """The op ``kda::<name>``: ``(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
    cu_seqlens, cu_seqlens_cpu) -> (o, final state)`` by ``forward`` (same arguments), with a fake that gives the
    shapes. Both outputs are contiguous, the final state an empty tensor where it was not asked for."""

    @torch.library.custom_op(f"kda::{name}", mutates_args=())
    def op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, initial_state: Optional[Tensor],
           output_final_state: bool, use_qk_l2norm: bool, cu_seqlens: Optional[Tensor],
           cu_seqlens_cpu: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        o, final = forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                           cu_seqlens_cpu)
        return o.contiguous(), (final.contiguous() if final is not None else v.new_empty(0, dtype=torch.float32))

    @op.register_fake
    def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens, cu_seqlens_cpu):
        return v.new_empty(v.shape), _final_like(v, q, cu_seqlens, output_final_state)

    return op


def _chunk_forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                   cu_seqlens_cpu):
    from kda import gated_delta            # here, not above: importing kda loads no level until used
    return gated_delta.forward_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
                                     cu_seqlens, g.dim() == 4, False, cu_seqlens_cpu)


def _recurrent_forward(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                       cu_seqlens_cpu):
    from kda import decode
    return decode.recurrent_eager(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm,
                                  cu_seqlens, None, g.dim() == 4, False, cu_seqlens_cpu)


chunk_gated_delta = _forward_op("chunk_gated_delta", _chunk_forward)
fused_recurrent = _forward_op("fused_recurrent", _recurrent_forward)


@torch.library.custom_op("kda::fused_recurrent_pooled", mutates_args=("pool",))
def fused_recurrent_pooled(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float, pool: Tensor,
                           ssm_state_indices: Tensor, use_qk_l2norm: bool, cu_seqlens: Optional[Tensor],
                           cu_seqlens_cpu: Optional[Tensor]) -> Tensor:
    from kda import decode

    o, _ = decode.recurrent_eager(q, k, v, g, beta, scale, pool, False, use_qk_l2norm, cu_seqlens,
                                  ssm_state_indices, g.dim() == 4, False, cu_seqlens_cpu)
    return o.contiguous()


@fused_recurrent_pooled.register_fake
def _(q, k, v, g, beta, scale, pool, ssm_state_indices, use_qk_l2norm, cu_seqlens, cu_seqlens_cpu):
    return v.new_empty(v.shape)


def _save_inputs(ctx, inputs, output):
    """What the backward recomputes from: every tensor input, and the rest as they were."""
    ctx.save_for_backward(*(x if isinstance(x, Tensor) else None for x in inputs))
    ctx.others = tuple(None if isinstance(x, Tensor) else x for x in inputs)


def _recomputed_gradients(forward, inputs, do, dfinal) -> list[Tensor]:
    """The gradients of ``q, k, v, g, beta`` and the initial state (an empty tensor where there is
    none): ``forward(*inputs)`` recomputed (the CPU's float64 path, differentiable) and
    differentiated by autograd."""
    if any(isinstance(x, Tensor) and x.is_cuda for x in inputs):
        raise RuntimeError("the recomputing backward is the CPU's: CUDA tensors take kda.cuda_autograd's kernel")
    leaves = [x.detach().requires_grad_() if isinstance(x, Tensor) and x.is_floating_point() else x for x in inputs]
    # an op's body runs below autograd (the autograd dispatch keys excluded); put them back for the recompute
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality) | \
        torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                         torch._C._dispatch_tls_local_exclude_set() - keys), torch.enable_grad():
        o, final = forward(*leaves)
        outs, grads = [o], [do]
        if final.numel():
            outs.append(final)
            grads.append(dfinal)
        wanted = [x for x in leaves[:7] if isinstance(x, Tensor) and x.requires_grad]
        found = iter(torch.autograd.grad(outs, wanted, grads, allow_unused=True))
    out = []
    for x in leaves[:7]:
        if isinstance(x, Tensor) and x.requires_grad:
            grad = next(found)
            out.append(x.new_zeros(x.shape) if grad is None else grad.contiguous())
    return out


@torch.library.custom_op("kda::chunk_gated_delta_backward", mutates_args=())
def chunk_gated_delta_backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
                               initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm: bool,
                               cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
                               dfinal: Tensor) -> list[Tensor]:
    """``dq, dk, dv, dg, dbeta`` and, with an initial state, its gradient: an op of its own, so that
    a compiled graph's backward calls it without tracing into the float64 recompute."""
    return _recomputed_gradients(_chunk_forward, (q, k, v, g, beta, scale, initial_state, output_final_state,
                                                  use_qk_l2norm, cu_seqlens, cu_seqlens_cpu), do, dfinal)


def _gradients_like(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                    cu_seqlens_cpu, do, dfinal):
    """The fake of both backward ops: one gradient shaped like each input that has one."""
    return [x.new_empty(x.shape) for x in (q, k, v, g, beta, initial_state) if x is not None]


chunk_gated_delta_backward.register_fake(_gradients_like)


@torch.library.custom_op("kda::fused_recurrent_backward", mutates_args=())
def fused_recurrent_backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
                             initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm: bool,
                             cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
                             dfinal: Tensor) -> list[Tensor]:
    """The same for ``fused_recurrent``."""
    return _recomputed_gradients(_recurrent_forward, (q, k, v, g, beta, scale, initial_state, output_final_state,
                                                      use_qk_l2norm, cu_seqlens, cu_seqlens_cpu), do, dfinal)


fused_recurrent_backward.register_fake(_gradients_like)


def _backward(op):
    """The registered backward of a forward op: its backward op on the saved inputs, the gradients
    put back in the places of the forward's arguments (``None`` for the others)."""
    def backward(ctx, do, dfinal):
        inputs = [t if t is not None else o for t, o in zip(ctx.saved_tensors, ctx.others)]
        grads = iter(op(*inputs, do.contiguous(), dfinal.contiguous()))
        has_initial_state = inputs[6] is not None
        return (*(next(grads) for _ in range(5)), None, next(grads) if has_initial_state else None,
                None, None, None, None)
    return backward


chunk_gated_delta.register_autograd(_backward(chunk_gated_delta_backward), setup_context=_save_inputs)
fused_recurrent.register_autograd(_backward(fused_recurrent_backward), setup_context=_save_inputs)
