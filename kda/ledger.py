"""FLOP and byte counts: the articles' ledgers and the hardware floor of a benchmark.

Counting convention: a multiply-add is 2 FLOPs; a GEMM ``[m, k] x [k, n]`` is ``2 m k n``.
"""

from __future__ import annotations

from kda.chunking import ceildiv

# Ceilings of the H200 used for every "fraction of the floor" on the site: HBM copy
# bandwidth (bytes read + written) and a large bf16 matrix product, both measured on that card.
H200_HBM_BYTES_PER_S = 4.3e12
H200_BF16_FLOPS = 686e12


# --8<-- [start:level1_ledger]
def seq_in_grid_state_flops(N: int, D: int, C: int) -> int:
    """Step (1) of the sequence-in-grid kernel: block c runs c state GEMMs ``[D,C]x[C,D]``."""
    NC = N // C
    return NC * (NC - 1) // 2 * 2 * C * D * D


def chunked_ideal_flops(N: int, D: int, C: int) -> int:
    """Each chunk once: read-out ``2 N D^2`` + state update ``2 N D^2`` + intra ``4 N C D``."""
    return 4 * N * D * (D + C)


def causal_attention_flops(N: int, D: int) -> int:
    """Causal softmax attention counted as in the article: half of ``4 N^2 D``."""
    return 2 * N * N * D


def seq_in_loop_state_flops(N: int, D: int, C: int) -> int:
    """State updates of the sequence-in-loop kernel: one GEMM per chunk, ``2 N D^2``."""
    return (N // C) * 2 * C * D * D


def redundancy(N: int, C: int) -> float:
    """How many times more state GEMMs the sequence-in-grid kernel runs: ``(NC - 1) / 2``."""
    return (N // C - 1) / 2
# --8<-- [end:level1_ledger]


def forward_flops(B: int, T: int, H: int, DK: int, DV: int, C: int = 64, delta: bool = False) -> int:
    """FLOPs of one chunkwise forward pass as the kernels issue them, per token, with full ``C x C``
    intra blocks and before any re-computation across value stripes.

    Without the delta rule (levels 1-3): ``Q K^T`` and its product with ``V`` (``2 C (DK + DV)``),
    ``Q S`` and ``K^T V`` (``2 DK DV`` each). With it (levels 4-5): ``K K^T`` and ``Q K^T`` (``2 C DK``
    each), ``W`` and ``U`` (``2 C (DK + DV)``), ``tril(Q K^T)`` times the corrected values
    (``2 C DV``), and three state products ``W S``, ``Q S``, ``K^T (U - W S)``; the ``C^3`` solve is
    left out (under 2% at ``C = 64``)."""
    tokens = B * T * H
    if delta:
        return tokens * (2 * C * (3 * DK + 2 * DV) + 6 * DK * DV)
    return tokens * (4 * DK * DV + 2 * C * (DK + DV))


def forward_min_bytes(B: int, T: int, H: int, DK: int, DV: int, elem_bytes: int = 2) -> int:
    """Fewest HBM bytes of a forward pass: read q, k, v once and write o once."""
    return B * T * H * (2 * DK + 2 * DV) * elem_bytes


def state_snapshot_bytes(B: int, T: int, H: int, DK: int, DV: int, C: int = 64, elem_bytes: int = 2) -> int:
    """Bytes of the per-chunk states ``h [B, NC, H, DK, DV]`` that a split (two-kernel) design stores."""
    return B * ceildiv(T, C) * H * DK * DV * elem_bytes


def floor_seconds(flops: float, nbytes: float) -> float:
    """The hardware floor: the larger of the arithmetic time and the memory time."""
    return max(flops / H200_BF16_FLOPS, nbytes / H200_HBM_BYTES_PER_S)
