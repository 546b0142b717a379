"""Timing on the GPU and the peers we compare with (fla). Used by the GPU snippets.

Timing: CUDA events through ``triton.testing.do_bench`` (it flushes the L2 between
runs), median of many runs after warm-up. Benchmarks are scripts and recorded results;
nothing here is asserted in tests.
"""

from __future__ import annotations

import torch


def median_ms(fn, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    """Median latency of ``fn()`` in milliseconds; ``fn`` is called once first to warm up."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def captured(call):
    """``call`` run once on a side stream (which compiles its kernels and warms up, as torch asks before a
    capture), then captured in a CUDA graph: ``(graph, the outputs of the captured call)``, whose tensors each
    replay writes again."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def random_qkv(B, T, H, DK, DV, dtype=torch.bfloat16, device="cuda", seed=0):
    """Inputs like a model's after its projections: unit-variance q, k, v."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, DK, generator=g, device=device).to(dtype)
    k = torch.randn(B, T, H, DK, generator=g, device=device).to(dtype)
    v = torch.randn(B, T, H, DV, generator=g, device=device).to(dtype)
    return q, k, v


def fla_linear_attention(q, k, v, scale):
    """fla's level-1 peer: ``chunk_linear_attn(normalize=False)`` (fla calls chunk_simple_gla)."""
    from fla.ops.linear_attn import chunk_linear_attn

    return chunk_linear_attn(q, k, v, scale=scale, normalize=False)[0]


def fla_decay_attention(q, k, v, g_gamma, scale):
    """fla's level-2 peer: ``chunk_simple_gla`` with ``g_gamma [H]`` = log of the per-head decay
    (a float32 tensor on the device, prepared once, as a model would hold it)."""
    from fla.ops.simple_gla import chunk_simple_gla

    return chunk_simple_gla(q, k, v, g_gamma=g_gamma, scale=scale)[0]


def versions() -> dict:
    """Versions of what a GPU record depends on."""
    import importlib.metadata as md

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("triton", "tilelang", "fla-core", "flash-qla"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out
