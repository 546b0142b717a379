"""A Kimi Delta Attention layer built on the package's ops: what a model calls for a prefill and
then for each decode step (issue 17). It follows the shape of fla's ``KimiDeltaAttention`` layer:

* projections of the hidden states to ``q, k`` (``H`` heads of ``K``) and ``v`` (``HV`` heads of ``V``),
  each through a depthwise causal convolution of width ``conv_size`` and SiLU;
* the gate: a low-rank projection to ``[HV, K]`` raw values, turned into the log decay
  ``-exp(A_log) softplus(g + dt_bias)``; ``beta = sigmoid(b)`` from one more projection;
* the op with fla's activation arguments (``chunk_kda`` for the prefill, ``fused_recurrent_kda``,
  which applies them in its kernel, for decode steps), with ``q, k`` L2-normalized inside;
* the output: RMS-normalized per head, gated by ``sigmoid`` of a low-rank projection, projected back.

The cache between calls holds the last ``conv_size - 1`` inputs of each convolution and the
recurrent state ``[B, HV, K, V]`` (float32).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kda.decode import fused_recurrent_kda
from kda.gated_delta import chunk_kda

# CUDA, no autograd, not under torch.compile: the short convolutions and the output's gated norm by kernels of their
# own (kda/kernels/causal_conv.py, kda/kernels/norms.py's gated_rms_norm_rows), each reading its input once, instead
# of torch's transposed copies, concatenations and float32 passes (run 135, H100, hidden 2304, 32 heads of 128, 8192
# tokens: this layer's forward 5.33 ms, the same module with fla's convolution, op and norm 2.39, with our op the
# faster one). Run 136 (H100) passed their GPU tests (tests/test_gpu_layer.py: both kernels against float64, bf16 and
# fp16, tails and ragged rows; the layer's prefill and decode steps against torch's form) and timed the forward at
# that size: 2.154 ms with them against 5.344 (fla's pieces 2.418) at T 8192, 8.220 against 20.983 (9.432) at 32768;
# a decode step at batch 64 the same (0.849 against 0.839 ms): on.
LAYER_KERNELS = True


def layer_kernels_apply(x, *weights) -> bool:
    """Whether the layer's own kernels run (``LAYER_KERNELS``): CUDA, bf16 or fp16, nothing to differentiate, not
    traced by ``torch.compile`` (which fuses torch's form itself)."""
    if not (LAYER_KERNELS and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, *weights)))


class Cache(NamedTuple):
    conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # q, k, v tails [B, channels, conv_size - 1]
    state: torch.Tensor                                      # [B, HV, K, V], float32


class ShortConvolution(nn.Module):
    """Depthwise causal convolution over time with SiLU; ``tail`` carries the previous inputs."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels, 1, width) / math.sqrt(width))
        self.width = width

    def forward(self, x, tail=None):
        """``x [B, T, C]`` -> ``(y [B, T, C], new tail [B, C, width - 1])``."""
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[2], self.width - 1)
        if layer_kernels_apply(x, self.weight):
            from kda.kernels.causal_conv import causal_conv

            # the kernel reads x where it lies; the new tail from the last few tokens alone
            last = torch.cat([tail, x[:, -(self.width - 1):].transpose(1, 2)], dim=2)
            return causal_conv(x, self.weight, tail), last[:, :, last.shape[2] - (self.width - 1):]
        padded = torch.cat([tail, x.transpose(1, 2)], dim=2)
        y = F.conv1d(padded, self.weight, groups=x.shape[2])
        return F.silu(y).transpose(1, 2), padded[:, :, padded.shape[2] - (self.width - 1):]


class KimiDeltaAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, num_v_heads: int | None = None,
                 conv_size: int = 4):
        super().__init__()
        H, HV, K = num_heads, num_v_heads or num_heads, head_dim
        self.H, self.HV, self.K, self.V = H, HV, K, K
        self.q_proj = nn.Linear(hidden_size, H * K, bias=False)
        self.k_proj = nn.Linear(hidden_size, H * K, bias=False)
        self.v_proj = nn.Linear(hidden_size, HV * K, bias=False)
        self.q_conv, self.k_conv = ShortConvolution(H * K, conv_size), ShortConvolution(H * K, conv_size)
        self.v_conv = ShortConvolution(HV * K, conv_size)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, K, bias=False), nn.Linear(K, HV * K, bias=False))
        self.b_proj = nn.Linear(hidden_size, HV, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(HV).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(torch.randn(HV * K) * 0.1)
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, K, bias=False), nn.Linear(K, HV * K, bias=False))
        self.o_norm = nn.Parameter(torch.ones(K))
        self.o_proj = nn.Linear(HV * K, hidden_size, bias=False)

    def forward(self, x, cache: Cache | None = None, decode: bool = False):
        """``x [B, T, hidden]`` -> ``(y [B, T, hidden], cache)``. ``decode=True`` runs the recurrent
        kernel from ``cache`` (a few tokens per step); otherwise the chunked forward (a prefill, from
        ``cache`` if given)."""
        B, T, _ = x.shape
        tails = cache.conv if cache is not None else (None, None, None)
        q, tq = self.q_conv(self.q_proj(x), tails[0])
        k, tk = self.k_conv(self.k_proj(x), tails[1])
        v, tv = self.v_conv(self.v_proj(x), tails[2])
        q, k = q.view(B, T, self.H, self.K), k.view(B, T, self.H, self.K)
        v = v.view(B, T, self.HV, self.V)
        raw = self.f_proj(x).view(B, T, self.HV, self.K)
        b = self.b_proj(x)
        state = cache.state if cache is not None else None
        run = fused_recurrent_kda if decode else chunk_kda      # a decode step, or a prefill
        o, state = run(q, k, v, raw, b, A_log=self.A_log, dt_bias=self.dt_bias, initial_state=state,
                       output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                       use_beta_sigmoid_in_kernel=True)
        gate = self.g_proj(x).view(B, T, self.HV, self.V)
        if layer_kernels_apply(o, gate, self.o_norm):
            from kda.kernels.norms import gated_rms_normalized

            o = gated_rms_normalized(o, gate, self.o_norm, 1e-6)
        else:
            o = o * torch.rsqrt(o.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(o.dtype) * self.o_norm
            o = o * torch.sigmoid(gate)
        return self.o_proj(o.reshape(B, T, self.HV * self.V)), Cache((tq, tk, tv), state)
