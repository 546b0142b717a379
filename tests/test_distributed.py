"""Context parallel on the CPU with gloo: 2 and 4 ranks spawned by the test, uneven slices; the
outputs and the final state equal the single-process forward to float64 precision."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kda.distributed import choose_pieces, context_parallel, local_affine_map, map_bytes, split_forward
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

import random_inputs

def inputs(T, per_channel, seed=0):
    # mild gates: a third of the state survives 100 tokens, so a slice's M matters (under gates of
    # order -1 it underflows and a fold that ignored M would pass unnoticed)
    drawn = random_inputs.gated_delta(2, T, 2, 16, 8, gate="channel" if per_channel else "head", form="uniform",
                                      strength=0.02, seed=seed)
    return drawn[:6]


def _rank_main(rank, world, port, bounds, per_channel, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    q, k, v, g, beta, h0 = inputs(bounds[-1], per_channel)
    s, e = bounds[rank], bounds[rank + 1]
    o, final = context_parallel(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], scale=0.5,
                                initial_state=h0, output_final_state=True)
    torch.save({"o": o, "final": final}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("bounds", [[0, 100, 230], [0, 7, 100, 164, 230]], ids=["2 ranks", "4 ranks"])
def test_context_parallel_equals_single_process(bounds, per_channel, tmp_path, free_port):
    world = len(bounds) - 1
    mp.spawn(_rank_main, args=(world, free_port, bounds, per_channel, str(tmp_path)), nprocs=world, join=True)
    q, k, v, g, beta, h0 = inputs(bounds[-1], per_channel)
    forward = chunk_kda if per_channel else chunk_gated_delta_rule
    o_ref, final_ref = forward(q, k, v, g, beta, 0.5, h0, True)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    o = torch.cat([p["o"] for p in parts], dim=1)
    assert rel_l2(o, o_ref) < 1e-12
    assert all(p["final"] is None for p in parts[:-1])
    assert rel_l2(parts[-1]["final"], final_ref) < 1e-6              # final states are float32


def test_slice_map_matches_the_recurrence():
    """S_end = M S_start + B for a slice of 150 tokens (three chunks, a tail) and any start state."""
    q, k, v, g, beta, h0 = inputs(150, True)
    M, Bm = local_affine_map(k, v, g, beta)
    _, S_end = ref0.recurrent(q, k, v, g, beta, h0, True)
    assert rel_l2(M @ h0 + Bm, S_end) < 1e-12
    assert map_bytes(2, 2, 16, 8) == M.numel() * 8 + Bm.numel() * 8


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("T,pieces", [(1, 4), (130, 2), (300, 3), (256, 4), (300, 100)])
def test_split_forward_equals_the_plain_forward(T, pieces, per_channel):
    """Intra-card split: runs' maps folded in order, every run recomputed from its true state."""
    q, k, v, g, beta, h0 = inputs(T, per_channel, seed=T)
    forward = chunk_kda if per_channel else chunk_gated_delta_rule
    o, s = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, s2 = split_forward(q, k, v, g, beta, pieces, initial_state=h0, output_final_state=True)
    assert rel_l2(o2, o) < 1e-12 and rel_l2(s2, s) < 1e-12
    o3, s3 = split_forward(q * 3, k * 2, v, g, beta, pieces, initial_state=h0, output_final_state=True,
                           use_qk_l2norm_in_kernel=True)
    o4, s4 = forward(q * 3, k * 2, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel_l2(o3, o4) < 1e-12 and rel_l2(s3, s4) < 1e-12
    with pytest.raises(ValueError, match="pieces"):
        split_forward(q, k, v, g, beta, 0)


def test_split_forward_rejects_bad_input():
    q, k, v, g, beta, h0 = inputs(130, True)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="pieces"):
            split_forward(q, k, v, g, beta, bad)
    with pytest.raises(ValueError, match="beta"):
        split_forward(q, k, v, g, beta * 2 + 1, 2)
    with pytest.raises(ValueError, match="initial_state"):
        split_forward(q, k, v, g, beta, 2, initial_state=h0[:1])
    o, s = split_forward(q, k, v, g, beta, None, initial_state=h0, output_final_state=True)   # CPU: no split
    o_ref, s_ref = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)


@pytest.mark.parametrize("B,H,DV,T,expected", [
    (1, 4, 128, 131072, 8),       # 16 blocks for 132 SMs: 8 runs fill them
    (1, 8, 128, 131072, 4),       # 32 blocks: 4 runs
    (1, 16, 128, 131072, 1),      # 64 blocks: 2 runs would make three passes of half the length
    (1, 32, 128, 32768, 1),       # the SMs are full already
    (1, 4, 128, 65536, 4),        # 1024 chunks: no run shorter than 256 chunks
    (1, 4, 128, 32768, 1),        # 512 chunks: two runs at most
    (1, 4, 128, 8192, 1),         # 128 chunks: two runs at most, not worth three passes
])
def test_choose_pieces(B, H, DV, T, expected):
    assert choose_pieces(B, H, DV, T, sm_count=132) == expected


def test_grouped_value_heads_are_refused():
    q = k = torch.randn(1, 64, 2, 16)
    v, g, beta = torch.randn(1, 64, 4, 16), -torch.rand(1, 64, 4, 16), torch.rand(1, 64, 4)
    with pytest.raises(ValueError, match="need v with the H = 2 heads of q"):
        split_forward(q, k, v, g, beta, 2)
