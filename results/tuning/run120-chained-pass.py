"""Run 120 (CPU, 2026-12-06): the scalar-gate pass with a shorter chain, mimicked before it is built.

``inverse_state_output_pass`` (``kda/kernels/scalar_gate.py``) carries the state ``S`` from chunk to chunk; per chunk
the chain is ``K S`` (a 64 x 128 x 128 GEMM), ``V_new = Tb (V - 2^G K S)`` (64 x 64 x 128), ``V' = 2^(G_last - G)
V_new`` and ``S <- 2^g S + K^T V'`` (128 x 64 x 128), each behind a barrier. FlashQLA's pass has the same three
GEMMs on its chain and takes 3.1 us a chunk on an H100 against this one's 4.1 (runs 105 and 118). The reordered
chain carries ``KS_j = K_j S_j`` instead:

    KS_{j+1} = 2^(g_j) (K_{j+1} S_j) + (K_{j+1} K_j^T) V'_j

where ``K_{j+1} S_j`` and ``K_{j+1} K_j^T`` need nothing of chunk ``j``'s result, so another warpgroup can make them
while chunk ``j`` runs; the chain keeps two 64 x 64 x 128 GEMMs (``Tb X`` and ``(K_{j+1} K_j^T) V'``), and the
state's update and ``K_{j+1} S_j`` leave it. This script checks, in float64, that the reordered arithmetic is the
recurrence (tails, an initial state, runs of -20, no decay), and measures, with the kernel's roundings to bf16
emulated (the GEMMs' operands; the state and ``K S`` accumulated in float32), how far each order drifts from float64
over long sequences: the reordered chain adds the carried ``K S`` to itself chunk after chunk instead of
recomputing it from ``S``. Rows to ``$OUT/run120.jsonl``.

    python results/tuning/run120-chained-pass.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
import harness  # noqa: E402

from kda.metrics import rel_l2  # noqa: E402
from kda.reference import level0 as ref0  # noqa: E402
from kda.reference.common import start_state  # noqa: E402
from kda.reference.scalar_gate import chunk_inverse  # noqa: E402

RUN = "run120"


def rounded(x, dtype):
    """``x`` as the kernel hands it to a GEMM: rounded to ``dtype`` (None: exact), kept in x's dtype."""
    return x if dtype is None else x.to(dtype).to(x.dtype)


def scalar_gate_pass(q, k, v, g, beta, C=64, h0=None, chained=False, operands=None, accum=torch.float64):
    """GDN's pass the way ``inverse_state_output_pass`` orders it (``chained=False``) or with the chain on ``K S``
    (``chained=True``). ``operands``: the dtype every GEMM operand is rounded to (the kernel's bf16); ``accum``: the
    dtype of the state, the carried ``K S`` and the GEMMs' accumulators (the kernel's float32)."""
    q, k, v, beta = (x.transpose(1, 2).to(torch.float64) for x in (q, k, v, beta))      # [B, H, T, ...]
    g = g.to(torch.float64).transpose(1, 2)
    r = lambda x: rounded(x, operands)
    acc = lambda x: x.to(accum).to(torch.float64)
    S = acc(start_state(q.transpose(1, 2), v.transpose(1, 2), h0))
    T = q.shape[2]
    out = torch.empty_like(v)
    chunks = [slice(s, min(s + C, T)) for s in range(0, T, C)]
    KS = acc(r(k[:, :, chunks[0]]) @ r(S)) if chained else None
    for j, c in enumerate(chunks):
        K, Q = r(k[:, :, c]), r(q[:, :, c])
        G, decay, Tb = chunk_inverse(k[:, :, c], g[:, :, c], beta[:, :, c])
        Tb = r(Tb)
        if not chained:
            KS = acc(K @ r(S))
        new = acc(Tb @ r(v[:, :, c] - torch.exp(G)[..., None] * KS))
        out[:, :, c] = torch.exp(G)[..., None] * (Q @ r(S)) + r((Q @ K.transpose(-1, -2)) * decay).tril() @ r(new)
        V_prime = r(torch.exp(G[..., -1:] - G)[..., None] * new)
        fall = torch.exp(G[..., -1])[..., None, None]
        if chained and j + 1 < len(chunks):
            K_next = r(k[:, :, chunks[j + 1]])
            # K_{j+1} S_j and K_{j+1} K_j^T: nothing of chunk j's result, off the chain
            KS = acc(fall * acc(K_next @ r(S)) + r(acc(K_next @ K.transpose(-1, -2))) @ V_prime)
        S = acc(fall * S + K.transpose(-1, -2) @ V_prime)
    return out.transpose(1, 2).contiguous(), S


def inputs(B, T, H, D, gates, seed):
    gen = torch.Generator().manual_seed(seed)
    q, v = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), torch.randn(B, T, H, D, generator=gen,
                                                                                   dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))
    if gates == "runs_of_-20":
        g[:, 20:90] = -20.0
    elif gates == "mild":
        g = -0.003 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    elif gates == "zero":
        g = torch.zeros_like(g)
    beta, h0 = torch.rand(B, T, H, generator=gen, dtype=torch.float64), torch.randn(B, H, D, D, generator=gen,
                                                                                    dtype=torch.float64)
    return q * D ** -0.5, k, v, g, beta, h0


def main():
    # 1. exact arithmetic: the reordered chain is the recurrence
    for gates in ("logsigmoid", "runs_of_-20", "zero", "mild"):
        for T in (1, 64, 130, 700):
            q, k, v, g, beta, h0 = inputs(2, T, 3, 16, gates, T)
            want_o, want_S = ref0.recurrent(q, k, v, g, beta, h0, True)
            o, S = scalar_gate_pass(q, k, v, g, beta, h0=h0, chained=True)
            err = max(rel_l2(o, want_o), rel_l2(S, want_S))
            harness.log(RUN, {"stage": "float64", "gates": gates, "T": T, "rel_l2": float(f"{err:.2e}")})
            assert err < 1e-12, (gates, T, err)
    # 2. the kernel's roundings emulated: each order against float64 over long sequences
    for gates in ("logsigmoid", "mild"):
        for T in (2048, int(os.environ.get("RUN120_LONG", 8192))):
            q, k, v, g, beta, h0 = inputs(1, T, 2, 64, gates, 7)
            want_o, want_S = ref0.recurrent(q, k, v, g, beta, h0, True)
            row = {"stage": "bf16 operands, float32 accumulators", "gates": gates, "T": T, "D": 64}
            for chained in (False, True):
                o, S = scalar_gate_pass(q, k, v, g, beta, h0=h0, chained=chained, operands=torch.bfloat16,
                                        accum=torch.float32)
                row["chained" if chained else "kernel's order"] = [float(f"{rel_l2(o, want_o):.3e}"),
                                                                   float(f"{rel_l2(S, want_S):.3e}")]
            harness.log(RUN, row)


if __name__ == "__main__":
    main()
