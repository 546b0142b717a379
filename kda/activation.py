"""fla's gate and ``beta`` activations, shared by the chunked forward and decode.

``use_gate_in_kernel`` turns a raw gate into the log decay ``-exp(A_log) softplus(g + dt_bias)``,
or with ``lower_bound`` into ``lower_bound sigmoid(exp(A_log) (g + dt_bias))`` (``A_log`` may then be
``None``); ``use_beta_sigmoid_in_kernel`` turns logits into ``beta = sigmoid(.)`` (``2 sigmoid(.)``
with ``allow_neg_eigval``). The decode kernel applies them as it reads each token; the chunked
forward applies them in torch before its kernels (not fused yet), and so does the CPU path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Activation(NamedTuple):
    """fla's gate and ``beta`` activations (what the decode kernel does as it reads each token):
    ``gate`` ``None`` (``g`` is the log decay), ``"softplus"`` (``-exp(A_log) softplus(g + dt_bias)``)
    or ``"sigmoid"`` (``lower_bound sigmoid(exp(A_log) (g + dt_bias))``); ``beta`` ``None``,
    ``"sigmoid"`` or ``"2sigmoid"`` (negative eigenvalues allowed)."""
    gate: str | None
    beta: str | None
    A_log: torch.Tensor | None          # [HV], float32
    dt_bias: torch.Tensor | None        # [HV, K] or [HV, 1], float32
    lower_bound: float

    def apply(self, g, beta, dtype=torch.float64):
        """The activations in torch, computed in ``dtype`` (float64 for the CPU path, float32 where
        a kernel reads the result)."""
        if self.gate is not None:
            HV, GD = g.shape[2], (g.shape[3] if g.dim() == 4 else 1)
            A = torch.exp(self.A_log.to(g.device, dtype)) if self.A_log is not None else \
                torch.ones(HV, dtype=dtype, device=g.device)
            bias = self.dt_bias.to(g.device, dtype) if self.dt_bias is not None else \
                torch.zeros(HV, GD, dtype=dtype, device=g.device)
            x = g.to(dtype) + (bias if g.dim() == 4 else bias[:, 0])
            A = A[:, None] if g.dim() == 4 else A
            g = -A * torch.nn.functional.softplus(x) if self.gate == "softplus" else \
                self.lower_bound * torch.sigmoid(A * x)
        if self.beta is not None:
            beta = (2.0 if self.beta == "2sigmoid" else 1.0) * torch.sigmoid(beta.to(dtype))
        return g, beta


def check_activation(g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                     lower_bound, state_v_first, check_values) -> Activation:
    """fla's activation options, checked (shapes ``[HV]`` for ``A_log``, ``[HV * K]`` or ``[HV]``
    for ``dt_bias``, a finite ``lower_bound < 0``); with ``check_values`` the raw ``g`` and ``beta``
    they apply to must be finite (read back)."""
    if state_v_first:
        raise ValueError("state_v_first is not supported: the states are [N, HV, K, V]")
    if not use_gate_in_kernel and (A_log is not None or dt_bias is not None or lower_bound is not None):
        raise ValueError("A_log, dt_bias and lower_bound describe the gate activation: pass use_gate_in_kernel=True")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in fla)")
    HV = g.shape[2]
    GD = g.shape[3] if g.dim() == 4 else 1
    if use_gate_in_kernel:
        if lower_bound is None and A_log is None:
            raise ValueError("use_gate_in_kernel needs A_log [HV] (or lower_bound for the sigmoid form)")
        for name, t, shape in (("A_log", A_log, (HV,)), ("dt_bias", dt_bias, (HV * GD,))):
            if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape
                                  or not t.is_floating_point() or t.device != g.device):
                raise ValueError(f"{name} must be a floating tensor of shape {list(shape)} on {g.device}, got {t!r}")
        if lower_bound is not None and not (isinstance(lower_bound, (int, float)) and -1e30 < lower_bound < 0):
            raise ValueError(f"lower_bound must be a finite negative number (the log decay's floor), "
                             f"got {lower_bound!r}")
    if check_values:
        for name, t, on in (("g", g, use_gate_in_kernel), ("beta", beta, use_beta_sigmoid_in_kernel)):
            if on and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} must be finite (the raw input of its activation)")
    return Activation(
        gate=("sigmoid" if lower_bound is not None else "softplus") if use_gate_in_kernel else None,
        beta=("2sigmoid" if allow_neg_eigval else "sigmoid") if use_beta_sigmoid_in_kernel else None,
        A_log=A_log.float().contiguous() if A_log is not None else None,
        dt_bias=dt_bias.float().reshape(HV, GD).contiguous() if dt_bias is not None else None,
        lower_bound=float(lower_bound) if lower_bound is not None else 0.0)


NO_ACTIVATION = Activation(None, None, None, None, 0.0)




def checked_activation(q, k, v, g, beta, per_channel: bool, options: dict, check_values: bool,
                       differentiable=False) -> Activation:
    """The ``Activation`` that ``options`` (fla's arguments) ask for, every shape checked first (``q, k, v``, ``g``
    as one gate per head or per channel, ``beta``), so that a wrong tensor gets the usual error; with
    ``check_values`` the raw ``g`` and ``beta`` it applies to must be finite. ``differentiable``: a CUDA call that
    ``kda.backward`` differentiates (its inputs may require grad)."""
    from kda import validate

    with validate.checks_allow_gradients(differentiable):
        B, T, H, DK, _ = validate.check_qkv(q, k, v, grouped_values=True)
        if validate.check_gates(g, B, T, H, DK, q.device, check_values=False) != per_channel:
            form = "[B, T, H, DK] (one gate per key channel)" if per_channel else "[B, T, H] (one gate per head)"
            raise ValueError(f"g must have shape {form} here, got {validate.shape_of(g)}")
        validate.check_beta(beta, B, T, H, q.device, check_values=False)
    return check_activation(g, beta, check_values=check_values, **options)    # builds dt_bias's view: graph on


def activated(q, k, v, g, beta, per_channel: bool, options: dict, check_values: bool, differentiable=False):
    """``g`` and ``beta`` after the activations that ``options`` ask for (``checked_activation``), in float32 on
    CUDA and float64 on the CPU: the chunked forward's path where its kernels do not apply them."""
    from kda import validate

    act = checked_activation(q, k, v, g, beta, per_channel, options, check_values, differentiable)
    return act.apply(g, beta, torch.float32 if validate.runs_kernels(q) else torch.float64)
