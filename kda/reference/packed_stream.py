"""Packed sequences as one stream of chunks, in float64: the design of issue 15's next step for short sequences.

The chunk table gives every sequence chunks of its own, so a sequence of ``n`` tokens costs ``ceil(n / C)`` chunks
and 1024 sequences of 1 to 64 tokens take 1024 chunks where their 33,606 tokens fill 526; tiles of whole sequences
(``kda.packed.sequence_tiles``) need no state, so they serve only calls without initial or final states, and still
leave rows empty. Here the packed tokens are cut into chunks of ``C`` rows as one sequence would be, whatever the
boundaries, and the state is reset where a sequence starts:

* inside a chunk, only pairs of one sequence interact (``A`` and the scores masked, as the tiles do);
* a row reads the state ``S`` entering the chunk only if its sequence started before the chunk (``rows < carried``:
  only the chunk's first sequence can have), in ``V_new = U - W S`` and in the output's ``Q S`` term;
* the state leaving the chunk is the last sequence's alone: its rows' ``K^T V_new`` (rows ``>= last``), plus the
  decayed ``S`` only where that sequence started before the chunk (then it is the chunk's only sequence).

Two integers per chunk carry this (``stream_chunk_marks``), so a kernel needs no table of sequences per chunk: the
chunk-parallel stage masks its pairs by each token's sequence (``starts``), the sequential pass reads the two marks.
Without initial and final states (a packed training batch) every chunk of the stream is a chunk of work, none
padded; 96 random lengths lose their half chunk per sequence too.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64
from kda.reference.level0 import chunk_wy
from kda.reference.level3 import pairwise_scores, per_channel


# --8<-- [start:stream_chunk_marks]
def stream_chunk_marks(bounds, chunk_size: int = 64) -> torch.Tensor:
    """``[NC, 2]`` (int64) for the chunks of ``C`` rows of ``T = bounds[-1]`` packed tokens: ``carried``, the rows
    at the chunk's start that continue a sequence begun before it (0 where a sequence starts on its first row, ``C``
    or the chunk's length where none starts in it), and ``last``, the first row of the chunk's last sequence (0
    where that sequence began at or before the chunk's start). Empty sequences start nowhere."""
    T = bounds[-1]
    starts = torch.tensor([s for s, e in zip(bounds[:-1], bounds[1:]) if e > s], dtype=torch.int64)
    marks = []
    for c0 in range(0, T, chunk_size):
        length = min(chunk_size, T - c0)
        inside = starts[(starts >= c0) & (starts < c0 + length)] - c0
        marks.append((int(inside[0]) if len(inside) else length, int(inside[-1]) if len(inside) else 0))
    return torch.tensor(marks, dtype=torch.int64).reshape(-1, 2)
# --8<-- [end:stream_chunk_marks]


# --8<-- [start:stream_chunked]
def stream_chunked(q, k, v, g, beta, bounds, chunk_size: int = 64):
    """The gated delta rule (KDA; GDN with ``g [1, T, H]``) over the packed sequences with boundaries ``bounds``
    (every sequence from a zero state, no final state), chunk by chunk over the stream of ``T`` tokens: ``q, k
    [1, T, H, DK]``, ``v [1, T, H, DV]``, ``beta [1, T, H]``. Returns ``o [1, T, H, DV]``."""
    q, k, v, beta = as_f64(q, k, v, beta)
    g = per_channel(g.to(torch.float64), k.shape[-1])
    heads = lambda x: x[0].transpose(0, 1)                                     # [H, T, ...]
    q, k, v, g, beta = heads(q), heads(k), heads(v), heads(g), beta[0].transpose(0, 1)
    T = q.shape[1]
    lengths = torch.tensor(bounds[1:]) - torch.tensor(bounds[:-1])
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)          # each token's sequence
    S = q.new_zeros(q.shape[0], k.shape[-1], v.shape[-1])
    out = torch.empty_like(v)
    for (carried, last), c0 in zip(stream_chunk_marks(bounds, chunk_size).tolist(), range(0, T, chunk_size)):
        c = slice(c0, min(c0 + chunk_size, T))
        rows = torch.arange(c.stop - c.start)
        same = seq[c][:, None] == seq[c][None, :]
        reads = (rows < carried).to(q.dtype)[:, None]                          # rows that read S
        # the WY form with A's pairs of two sequences masked
        U, W, G = chunk_wy(k[:, c], v[:, c], g[:, c], beta[:, c], pairs=same)
        new = U - reads * (W @ S)
        scores = pairwise_scores(q[:, c], k[:, c], G) * same
        out[:, c] = reads * ((q[:, c] * torch.exp(G)) @ S) + scores @ new
        K_dec = k[:, c] * torch.exp(G[..., -1:, :] - G) * (rows >= last).to(q.dtype)[:, None]
        keep = 1.0 if carried == c.stop - c.start else 0.0                     # the chunk is one sequence, begun before
        S = keep * torch.exp(G[..., -1, :])[..., None] * S + K_dec.transpose(-1, -2) @ new
    return out.transpose(0, 1)[None].contiguous()
# --8<-- [end:stream_chunked]
