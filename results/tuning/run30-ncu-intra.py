"""Run 30 (H200): one launch of chunk_intra (bf16, B=1, T=8192, H=32, D=128, logsigmoid gates)
for Nsight Compute; run as
``ncu --clock-control none --launch-count 1 --section ... python results/tuning/run30-ncu-intra.py [nodelta]``."""
import sys

import torch

from kda.bench import random_qkv
from kda.gated_delta import INTRA_CONFIG
from kda.kernels import level5
from kda.kernels.build import compile_program

B, T, H, D, C = 1, 8192, 32, 128, 64
delta = "nodelta" not in sys.argv
q, k, v = random_qkv(B, T, H, D, D, seed=1)
g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
beta = torch.rand(B, T, H, device="cuda")
e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="cuda")
Qw, Kw, W, U, A_qk, decay = e(B, T, H, D), e(B, T, H, D), e(B, T, H, D), e(B, T, H, D), e(B, T, H, C), \
    e(B, H, T // C, D, dt=torch.float32)
kern = compile_program(level5.chunk_intra, (), DK=D, DV=D, dtype="bfloat16", delta=delta, **INTRA_CONFIG)
if delta:
    kern(q, k, v, g, beta, D ** -0.5, Qw, Kw, decay, A_qk, W, U)
else:
    kern(q, k, g, D ** -0.5, Qw, Kw, decay, A_qk)
torch.cuda.synchronize()
