"""GDN (one gate per token and head) the way ``kda.kernels.scalar_gate`` computes it, in float64.

With a scalar gate the decay factors out of the chunk's matrix, so only the gated inverse is made
ahead of the state; everything else comes from the raw ``q, k, v`` inside the sequential pass.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, start_state
from kda.reference.level0 import chunk_wy, forward_substitution
from kda.reference.level3 import pairwise_scores


# --8<-- [start:scalar_gate_chunked]
def chunk_inverse(k, g, beta):
    """One chunk (``k [..., L, DK]``, ``g, beta [..., L]``): the gate's cumsum ``G``, the decays
    ``e^(G_i - G_j)`` on and below the diagonal (1 above, where nothing reads them) and the gated
    inverse ``Tb = (I + strict(diag(b) (K K^T * e^(G_i - G_j))))^-1 diag(b)``: what
    ``chunk_gated_inverse`` makes ahead of the state."""
    G = torch.cumsum(g, dim=-1)
    decay = torch.exp((G[..., :, None] - G[..., None, :]).tril())
    eye = torch.eye(k.shape[-2], dtype=k.dtype, device=k.device)
    A = eye + (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    return G, decay, forward_substitution(A, torch.diag_embed(beta))


def scalar_gate_chunked(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=False):
    """GDN (``g [B, T, H]``) the way ``kda.kernels.scalar_gate`` computes it: per chunk only the
    gated inverse ``Tb`` (``chunk_inverse``) is made ahead of the state; then ``V_new = Tb (V - e^G (K
    S))``, which is ``U - W S`` without ``W`` or ``U``, the output ``e^G (Q S) + causal(Q K^T e^(G_i -
    G_j)) V_new`` and ``S <- e^G_last S + K^T (e^(G_last - G) V_new)``. Every exponent is ``<= 0``."""
    q, k, v, beta = (x.transpose(1, 2) for x in as_f64(q, k, v, beta))     # [B, H, T, ...]
    g = g.to(torch.float64).transpose(1, 2)
    S = start_state(q.transpose(1, 2), v.transpose(1, 2), initial_state)
    out = torch.empty_like(v)
    for s in range(0, q.shape[2], chunk_size):
        c = slice(s, min(s + chunk_size, q.shape[2]))
        K, Q = k[:, :, c], q[:, :, c]
        G, decay, Tb = chunk_inverse(K, g[:, :, c], beta[:, :, c])
        new = Tb @ (v[:, :, c] - torch.exp(G)[..., None] * (K @ S))
        out[:, :, c] = torch.exp(G)[..., None] * (Q @ S) + ((Q @ K.transpose(-1, -2)) * decay).tril() @ new
        S = torch.exp(G[..., -1])[..., None, None] * S + \
            K.transpose(-1, -2) @ (torch.exp(G[..., -1:] - G)[..., None] * new)
    return out.transpose(1, 2).contiguous(), (S if output_final_state else None)
# --8<-- [end:scalar_gate_chunked]


# --8<-- [start:packed_tiles]
def packed_tiles(q, k, v, g, beta, tiles, starts, rows=None):
    """GDN over packed sequences of at most one chunk each, no states, tile by tile as
    ``kda.kernels.scalar_gate.packed_tile_output`` makes it: a tile's tokens are ``tiles[n, 1]`` rows from
    ``tiles[n, 0]`` on, or the first ``tiles[n, 1]`` rows of ``rows[n]`` (``kda.packed.sequence_rows``); ``G`` the
    cumsum over the whole tile, every pair of two sequences (``starts``: each token's sequence by its first token)
    masked in ``A`` and in the scores; ``V_new = Tb V`` and ``O = causal(Q K^T e^(G_i - G_j)) V_new``. ``q, k [1, T,
    HQ, DK]`` (``q`` scaled), ``v [1, T, H, DV]``, ``g, beta [1, T, H]``, ``H`` a multiple of ``HQ``."""
    groups = v.shape[2] // q.shape[2]
    q, k = (x.repeat_interleave(groups, dim=2) for x in (q, k))
    q, k, v, beta = (x[0].transpose(0, 1) for x in as_f64(q, k, v, beta))      # [H, T, ...]
    g = g[0].to(torch.float64).transpose(0, 1)
    out = torch.full_like(v, float("nan"))                                     # every token is some tile's row
    for n, (first, length) in enumerate(tiles.tolist()):
        idx = rows[n, :length].long() if rows is not None else torch.arange(first, first + length)
        same = (starts[idx][:, None] == starts[idx][None, :]).to(k.dtype)
        K, Q, g_rows = k[:, idx], q[:, idx], g[:, idx, None].expand(-1, -1, k.shape[-1])
        new, _, G = chunk_wy(K, v[:, idx], g_rows, beta[:, idx], pairs=same)          # U: no state, V_new = U
        out[:, idx] = (pairwise_scores(Q, K, G) * same) @ new
    return out.transpose(0, 1)[None].contiguous()
# --8<-- [end:packed_tiles]
