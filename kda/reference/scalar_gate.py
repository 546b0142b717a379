"""GDN (one gate per token and head) the way ``kda.kernels.scalar_gate`` computes it, in float64.

With a scalar gate the decay factors out of the chunk's matrix, so only the gated inverse is made
ahead of the state; everything else comes from the raw ``q, k, v`` inside the sequential pass.
"""

from __future__ import annotations

import torch

from kda.reference.common import as_f64, start_state
from kda.reference.level0 import forward_substitution


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
