"""Context parallel for the gated delta rule (KDA, GDN) over ``torch.distributed``.

Each rank holds a contiguous slice of the same batch of sequences along ``T`` (rank order is
sequence order; slices may have different lengths). A slice acts on the state as an affine map
``S_end = M S_start + B`` (``kda.reference.level0.chunk_affine``, composed over its chunks), so:

1. every rank computes its slice's map with no initial state;
2. the maps are all-gathered (``map_bytes`` per rank and map);
3. rank ``r`` folds the maps of ranks ``0 .. r-1`` into its true starting state;
4. every rank recomputes its slice from that state; the last rank holds the final state.

This is the CPU path (gloo); the maps and the fold are float64. ``split_forward`` is the same
chain inside one device (the intra-card split), also in its CPU form for now.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from kda.gated_delta import CHUNK_SIZE, chunk_gated_delta_rule, chunk_kda
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.reference._common import start_state


# --8<-- [start:local_affine_map]
def local_affine_map(k, v, g, beta, chunk_size: int = CHUNK_SIZE):
    """``(M [B, H, K, K], B [B, H, K, V])`` of a whole slice, float64: the chunks' maps composed
    in order (``k, v, beta`` as in ``chunk_kda``; ``g`` per head or per channel)."""
    k, v, beta = (x.double().transpose(1, 2) for x in (k, v, beta))           # [B, H, T, ...]
    g = ref0.per_channel(g.double(), k.shape[-1]).transpose(1, 2)
    Bsz, H, T, K = k.shape
    eye = torch.eye(K, dtype=torch.float64).expand(Bsz, H, K, K)
    M, Bm = eye.clone(), torch.zeros(Bsz, H, K, v.shape[-1], dtype=torch.float64)
    for s in range(0, T, chunk_size):
        c = slice(s, min(s + chunk_size, T))
        M, Bm = ref0.compose((M, Bm), ref0.chunk_affine(k[:, :, c], v[:, :, c], g[:, :, c], beta[:, :, c]))
    return M, Bm
# --8<-- [end:local_affine_map]


def fold(state, maps):
    """The state entering each slice: ``S_0 = state``, ``S_{r+1} = M_r S_r + B_r`` for the maps
    ``[(M_0, B_0), ...]`` of the slices in order. Returns ``[S_0, ..., S_len(maps)]``."""
    states = [state]
    for M, Bm in maps:
        states.append(M @ states[-1] + Bm)
    return states


def map_bytes(B: int, H: int, K: int, V: int, elem_bytes: int = 8) -> int:
    """Bytes of one slice's map ``(M, B)``: what each rank contributes to the all-gather. A ring
    all-gather over ``P`` ranks makes every rank send ``(P - 1)`` of these."""
    return B * H * (K * K + K * V) * elem_bytes


# --8<-- [start:context_parallel]
def context_parallel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, group=None):
    """The forward of ``chunk_kda`` (``g [B, T_r, H, K]``) or ``chunk_gated_delta_rule``
    (``g [B, T_r, H]``) on this rank's slice of the sequence, exact across ranks.

    ``initial_state`` is the state before the first token of the whole sequence; pass the same
    tensor (or ``None``) on every rank. Returns ``(o, final_state)`` for the local slice;
    ``final_state`` only on the last rank (``None`` elsewhere)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    forward = chunk_kda if g.dim() == 4 else chunk_gated_delta_rule
    if use_qk_l2norm_in_kernel:
        q, k = ref4.l2_normalize(q.double()).to(q.dtype), ref4.l2_normalize(k.double()).to(k.dtype)
    M, Bm = local_affine_map(k, v, g, beta)
    maps_M = [torch.empty_like(M) for _ in range(world)]
    maps_B = [torch.empty_like(Bm) for _ in range(world)]
    dist.all_gather(maps_M, M, group=group)
    dist.all_gather(maps_B, Bm, group=group)
    S = fold(start_state(q, v, initial_state), zip(maps_M[:rank], maps_B[:rank]))[-1]
    o, final = forward(q, k, v, g, beta, scale, S, True)
    last = rank == world - 1
    return o, (final if output_final_state and last else None)
# --8<-- [end:context_parallel]


# --8<-- [start:split_forward]
def split_forward(q, k, v, g, beta, pieces: int, scale=None, initial_state=None, output_final_state=False,
                  chunk_size: int = CHUNK_SIZE):
    """Intra-card split, the same affine chain on one device: each sequence is cut into
    ``pieces`` runs of whole chunks; every run's map ``(M, B)`` is computed with no initial state
    (all runs at once on a GPU), the maps are folded in order into each run's true starting
    state, and every run is recomputed from it. Same arguments and results as ``chunk_kda``
    (``g [B, T, H, K]``) or ``chunk_gated_delta_rule`` (``g [B, T, H]``), without ``cu_seqlens``.

    This is the CPU form of the algorithm (float64 maps and fold); the GPU form, which runs the
    runs as a batch through the level-5 kernels, is not written yet."""
    if not isinstance(pieces, int) or pieces < 1:
        raise ValueError(f"pieces must be a positive int, got {pieces!r}")
    if q.device.type != "cpu":
        raise NotImplementedError("split_forward runs on CPU tensors only for now")
    forward = chunk_kda if g.dim() == 4 else chunk_gated_delta_rule
    T = q.shape[1]
    chunks = -(-T // chunk_size)
    run = -(-chunks // pieces) * chunk_size                            # whole chunks per run
    runs = [slice(s, min(s + run, T)) for s in range(0, T, run)]
    # the last run's map is not needed: the final state comes from its recompute
    maps = [local_affine_map(k[:, r], v[:, r], g[:, r], beta[:, r], chunk_size) for r in runs[:-1]]
    outputs = []
    for r, S0 in zip(runs, fold(start_state(q, v, initial_state), maps)):
        o, final = forward(q[:, r], k[:, r], v[:, r], g[:, r], beta[:, r], scale, S0, True)
        outputs.append(o)
    return torch.cat(outputs, dim=1), (final if output_final_state else None)
# --8<-- [end:split_forward]
