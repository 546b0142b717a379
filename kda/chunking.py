"""The chunk every chunkwise form of the package uses, and the one rounding-up division."""

from __future__ import annotations

CHUNK_SIZE = 64     # tokens per chunk: the kernels' tile height, the references' default


def ceildiv(n, d: int):
    """``ceil(n / d)`` for a non-negative integer ``n`` (a Python int or an integer tensor), exact."""
    return -(-n // d)
