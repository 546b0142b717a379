"""Level 4 public function: the delta rule, ``S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T``.

Conventions as in ``kda.ops``. On CUDA two kernels: ``kda.kernels.wy_solve.chunk_wy`` and
``kda.kernels.linear_pass.state_output_pass`` (state and output fused); on the CPU the chunked float64
reference.
"""

from __future__ import annotations

import torch

from kda import cuda_autograd, validate
from kda.chunking import CHUNK_SIZE
from kda.reference import level4 as ref4


def _run_kernels(q, k, v, beta, scale, h0, output_final_state, check=None):
    """``chunk_wy`` (all chunks at once, flagging a ``beta`` out of range as it reads it), then
    ``state_output_pass`` (sequential, fused output). ``check(flags)`` runs once the pass is
    queued (``validate.launch_then_check``), as in levels 3 and 5."""
    from kda.kernels.linear_pass import pass_launch
    from kda.kernels.wy_solve import run_chunk_wy

    flags = torch.zeros(2, dtype=torch.int32, device=q.device)
    W, U = run_chunk_wy(k, v, beta, flags)
    start, o, ht = pass_launch(q, k, U, scale, h0, output_final_state, W=W)
    validate.launch_then_check(flags, start, check)
    return o, ht


# --8<-- [start:delta_rule]
def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm=False, check_values=True):
    """The delta rule: ``S_t = S_{t-1} + b_t k_t (v_t - S_{t-1}^T k_t)^T``, ``o_t = S_t^T (scale q_t)``.

    Args:
        beta: ``[B, T, H]``, the step size per token and head, in ``[0, 1]``.
        use_qk_l2norm: L2-normalize ``q`` and ``k`` over the head dimension first (fla's
            ``use_qk_l2norm_in_kernel``); with unit keys and ``b <= 1`` every step is a
            contraction, which is what keeps the state bounded.
        check_values: check that every ``beta`` is in ``[0, 1]`` (and on the CPU, without
            ``use_qk_l2norm``, that ``beta ||k||^2 <= 2``: the delta rule's bound,
            ``validate.check_key_norms``). On CUDA the first kernel checks ``beta`` as it reads it and
            the host reads its flag once the second is queued (a wait for the first); ``False`` skips
            the read-back.
        q, k, v, scale, initial_state, output_final_state: as in ``kda.linear_attention``.

    Returns:
        ``o [B, T, H, DV]``, or ``(o, final_state)`` when ``output_final_state`` is true.
        Same function as fla's ``chunk_delta_rule``.
    """
    differentiable = cuda_autograd.level_differentiates(q, k=k, v=v, beta=beta, initial_state=initial_state)
    with validate.checks_allow_gradients(differentiable):
        B, T, H, DK, DV = validate.check_qkv(q, k, v)
        on_cuda = validate.runs_kernels(q)              # where the first kernel checks the values
        validate.check_beta(beta, B, T, H, q.device, check_values=check_values and not on_cuda)
        scale = validate.check_scale(scale, DK)
        h0 = validate.check_initial_state(initial_state, B, H, DK, DV, q.device)
        if check_values and not on_cuda and not use_qk_l2norm:
            validate.check_key_norms(k, beta)
    if use_qk_l2norm:                                   # torch operations: autograd takes them
        q, k = (ref4.l2_normalize(x.float()).to(x.dtype) for x in (q, k))
    check = (lambda flags: validate.raise_flagged_values(flags, None, beta)) if check_values else None
    kernels = lambda q, k, v, h0: _run_kernels(q, k, v, beta, scale, h0, output_final_state, check)
    reference = lambda q, k, v, h0: ref4.chunked(q, k, v, beta, CHUNK_SIZE, h0, output_final_state)
    return cuda_autograd.level_dispatch(q, k, v, h0, scale, output_final_state, kernels, reference, differentiable,
                                        beta=beta)
# --8<-- [end:delta_rule]
