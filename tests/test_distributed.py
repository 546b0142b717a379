"""Context parallel on the CPU with gloo: 2 and 4 ranks spawned by the test, uneven slices; the
outputs and the final state equal the single-process forward to float64 precision."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kda.distributed import (WARMUP_FALL, choose_pieces, context_parallel, gate_falls, local_affine_map, map_bytes,
                             split_forward, warmup_chunks, window_key_load, window_keys_stable,
                             window_serves)
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0

import random_inputs

def inputs(T, per_channel, seed=0, HQ=None):
    # mild gates: a third of the state survives 100 tokens, so a slice's M matters (under gates of
    # order -1 it underflows and a fold that ignored M would pass unnoticed); HQ = 1: grouped value heads
    drawn = random_inputs.gated_delta(2, T, 2, 16, 8, HQ=HQ, gate="channel" if per_channel else "head",
                                      form="uniform", strength=0.02, seed=seed)
    return drawn[:6]


def _rank_main(rank, world, port, bounds, per_channel, out_dir, HQ=None):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    q, k, v, g, beta, h0 = inputs(bounds[-1], per_channel, HQ=HQ)
    s, e = bounds[rank], bounds[rank + 1]
    o, final = context_parallel(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], scale=0.5,
                                initial_state=h0, output_final_state=True)
    torch.save({"o": o, "final": final}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.parametrize("per_channel,HQ", [(True, None), (False, None), (True, 1)],
                         ids=["kda", "gdn", "kda grouped"])
@pytest.mark.parametrize("bounds", [[0, 100, 230], [0, 7, 100, 164, 230]], ids=["2 ranks", "4 ranks"])
def test_context_parallel_equals_single_process(bounds, per_channel, HQ, tmp_path, free_port):
    world = len(bounds) - 1
    mp.spawn(_rank_main, args=(world, free_port, bounds, per_channel, str(tmp_path), HQ), nprocs=world, join=True)
    q, k, v, g, beta, h0 = inputs(bounds[-1], per_channel, HQ=HQ)
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


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
@pytest.mark.parametrize("T,pieces", [(300, 3), (1000, 5), (640, 2)])
def test_split_forward_warmup_starts(T, pieces, per_channel):
    """Warm-up starts: under gates that fall far within a chunk each run starts from the window of the run before
    it alone, and the outputs equal the plain forward's below float32's rounding (what is left out is scaled by
    e^-24 or less; the first chunk of a run, whose own state is small after steep gates, sees ~1e-9 of it); under
    mild gates no window gets there and the exact starts run, to float64 rounding."""
    q, k, v, _, beta, h0 = inputs(T, per_channel, seed=T)
    forward = chunk_kda if per_channel else chunk_gated_delta_rule
    steep = random_inputs.gated_delta(2, T, 2, 16, 8, gate="channel" if per_channel else "head", form="uniform",
                                      strength=2.0, seed=T + 1)[3]
    run_chunks = -(-(-(-T // 64)) // pieces)
    pieces, run_len = -(-(-(-T // 64)) // run_chunks), run_chunks * 64      # as split_forward makes them
    steep[:, run_len - 64:run_len] = -1e-3          # the first run's last chunk barely falls: a window of two
    assert warmup_chunks(gate_falls(steep, pieces, run_len, 64)) == 2
    mild = -torch.rand_like(steep) * 1e-3
    assert warmup_chunks(gate_falls(mild, pieces, run_len, 64)) == 0
    for g, bound in ((steep, 1e-7), (mild, 1e-12)):
        o, s = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        o2, s2 = split_forward(q, k, v, g, beta, pieces, initial_state=h0, output_final_state=True, warmup=True)
        assert rel_l2(o2, o) < bound and rel_l2(s2, s) < bound


def test_window_serves_agrees_with_the_window_read_back():
    """The device's check of a remembered window (no read back) says what ``warmup_chunks`` and
    ``window_keys_stable`` say of it."""
    q, k, v, g, beta, h0 = inputs(640, True)
    steep = random_inputs.gated_delta(2, 640, 2, 16, 8, form="uniform", strength=2.0, seed=3)[3]
    steep[:, 256 - 64:256] = -1e-3                   # runs of 4 chunks: the first run needs two
    for gates in (steep, -torch.rand_like(steep) * 1e-3):
        falls = gate_falls(gates, 2, 256, 64)
        need = warmup_chunks(falls)
        for window in (1, 2, 3, 4):
            assert bool(window_serves(falls, k, beta, 2, 256, window)) == (0 < need <= window)
    k = k.clone()
    k[0, 250, 1] *= 2                                # in the window's tokens: unstable keys
    assert not bool(window_serves(gate_falls(steep, 2, 256, 64), k, beta.clamp(min=0.6), 2, 256, 2))


def test_window_keys_stable():
    """Past the delta rule's bound a step may grow the state, and the window's bound no longer holds."""
    q, k, v, g, beta, h0 = inputs(256, True)
    assert window_keys_stable(k, beta, 2, 128, 64)
    k = k.clone()
    k[1, 127, 1] *= 1.5                              # in the first run's window; beta there is drawn in [0, 1]
    beta = beta.clone()
    beta[1, 127, 1] = 1.0
    assert not window_keys_stable(k, beta, 2, 128, 64)
    assert window_keys_stable(k, beta, 2, 128, 1) == (1.5 ** 2 <= 2)
    assert window_keys_stable(k, beta, 2, 160, 32)   # the token is outside every window


def test_window_key_load_with_grouped_value_heads():
    """Grouped keys as the CUDA split hands them (value head i reads key head i // 3): the same load as the keys
    repeated to the value heads, and an unstable key seen by the value heads that read it."""
    gen = torch.Generator().manual_seed(4)
    k, beta = torch.randn(2, 256, 2, 16, generator=gen) / 4, torch.rand(2, 256, 6, generator=gen)
    repeated = k.repeat_interleave(3, dim=2)
    assert torch.equal(window_key_load(k, beta, 2, 128, 64), window_key_load(repeated, beta, 2, 128, 64))
    k[1, 100, 1] *= 20                               # key head 1: value heads 3 to 5
    beta[1, 100] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.01])
    assert float(window_key_load(k, beta, 2, 128, 64)) == pytest.approx(0.01 * float(k[1, 100, 1].square().sum()))


def test_warmup_chunks_takes_the_slowest_channel():
    falls = torch.full((1, 2, 1, 4, 3), -30.0, dtype=torch.float64)      # every chunk falls far: one chunk
    assert warmup_chunks(falls) == 1
    falls[0, 1, 0, -1, 2] = -1.0                   # one channel of one run's last chunk falls slowly: two chunks
    assert warmup_chunks(falls) == 2
    falls[0, 0, 0, :, 0] = -1.0                    # one channel never gets there in run 0: exact starts
    assert warmup_chunks(falls) == 0
    assert warmup_chunks(torch.full((1, 1, 1, 2, 1), WARMUP_FALL / 2, dtype=torch.float64)) == 2


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


@pytest.mark.parametrize("B,H,DV,T,block_dv,expected", [
    (1, 4, 128, 131072, 32, 8),      # 16 blocks: 8 runs fill the SMs
    (1, 4, 128, 8192, 32, 8),        # 128 chunks: runs of 16
    (1, 32, 128, 32768, 128, 4),     # the scalar-gate pass's 32 blocks of 128 columns: 4 runs
    (1, 64, 128, 8192, 128, 2),      # 64 blocks: 2 runs pay once the starts are cheap
    (1, 96, 128, 8192, 128, 1),      # 96 blocks: one run
    (1, 4, 128, 1024, 32, 1),        # 16 chunks: no run shorter than 16
])
def test_choose_pieces_with_warmup_starts(B, H, DV, T, block_dv, expected):
    assert choose_pieces(B, H, DV, T, 132, block_dv, warmup=True) == expected


@pytest.mark.parametrize("warmup", [False, True], ids=["exact", "warmup"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["kda", "gdn"])
def test_split_forward_with_grouped_value_heads(per_channel, warmup):
    """Grouped value heads (2 query and key heads, 6 value heads: value head i reads head i // 3): the split equals
    the plain forward, exact and warm-up starts, with the keys normalized in the op too."""
    drawn = random_inputs.gated_delta(2, 300, 6, 16, 8, HQ=2, gate="channel" if per_channel else "head",
                                      form="uniform", strength=2.0 if warmup else 0.02, seed=5)
    q, k, v, g, beta, h0 = drawn[:6]
    forward = chunk_kda if per_channel else chunk_gated_delta_rule
    for scale_qk, norm in ((1, False), (3, True)):
        o, s = forward(q * scale_qk, k * scale_qk, v, g, beta, initial_state=h0, output_final_state=True,
                       use_qk_l2norm_in_kernel=norm)
        o2, s2 = split_forward(q * scale_qk, k * scale_qk, v, g, beta, 3, initial_state=h0, output_final_state=True,
                               use_qk_l2norm_in_kernel=norm, warmup=warmup)
        assert o2.shape == v.shape and s2.shape == h0.shape
        assert rel_l2(o2, o) < (1e-7 if warmup else 1e-12) and rel_l2(s2, s) < (1e-7 if warmup else 1e-12)
