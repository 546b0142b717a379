"""The backward of ``chunk_kda`` and ``chunk_gated_delta_rule`` on any device, CUDA included.

The three stages of ``kda.reference.backward`` (the state entering every chunk, the reverse state
pass, every chunk's gradients), run in ``float32`` on the inputs' device instead of float64 on the
CPU. Two things make them fit a GPU's memory at a model's shapes:

* the decays of a gate per channel are factored through a reference row per sub-chunk of 16 rows
  (``SubChunked``), so the chunk's sums are matrix products and only the pairs inside a sub-chunk
  are formed;
* the chunk-local work (the scores, the inverse, the chunk's gradients) is done for a group of
  chunks at a time, sized by ``MEMORY_BUDGET`` (a share of the GPU's free memory); only what
  the two state passes read is kept for every chunk (``STATE_PIECES``), and the states entering each
  chunk (float32 ``[DK, DV]`` per chunk and head, recomputed, not saved by the forward);
* packed sequences are laid end to end, each padded to whole chunks, so that the chunk-local work
  runs over all of them at once and only the state passes go sequence by sequence.

It is the CUDA backward's first form: torch operations, correct for any gate (every decay is a
pairwise ``exp`` of a number ``<= 0``). TileLang kernels replace its stages one by one, each behind
its own switch until its GPU tests pass: the state passes' pieces by the forward's ``chunk_intra``
(``FORWARD_PIECES``), the two state passes (``STATE_KERNELS``), and the chunk stage for a gate per
head (``CHUNK_KERNEL``). It is the CUDA implementation of the backward op of ``kda::chunk_gated_delta``
(``kda.custom_ops``, whose CUDA kernel in ``kda.cuda_autograd`` calls ``op_gradients``), and a CUDA call
that needs gradients goes through that op. On CUDA it is on since its GPU tests passed on the H200 (run
91; ``kda.cuda_autograd.DEVICE_BACKWARD``, listed in ``kda.cuda_paths``), and slow: forward and backward
of (1, 8192, 96, 128) take 883 ms against fla's 14.3 ms. On the CPU the public functions keep autograd
through their float64 path. Nothing of the forward imports this module.
"""

from __future__ import annotations

import contextlib

import torch

from kda.chunking import ceildiv
from kda.reference import backward as stages
from kda.reference.common import from_chunks, repeat_to_value_heads, to_chunks
from kda.reference.level4 import l2_normalize

# CUDA: the two state passes by the TileLang kernels of kda/kernels/backward_states.py (one launch each,
# dense batches) instead of torch launches per chunk, their GEMM operands in STATE_KERNELS_DTYPE. Their
# GPU tests passed (run 91); on since run 93 timed them: KDA at (1, 8192, 96, 128), forward + backward, 201 ms
# without them, 175 ms with them, the gradients as close to fla's as before (bf16 operands; the bound of
# their tests against the float64 recurrence is 2e-2 instead of the torch passes' 5e-3).
# STATE_KERNELS_DTYPE None: the inputs' dtype (bf16 or fp16, what the forward's pieces are already in);
# bf16 operands for fp16 inputs had made dh0 ten times less accurate than fla's (2.4e-3 against 2.1e-4,
# the backward/gpu_error record of run 98).
STATE_KERNELS = True
STATE_KERNELS_DTYPE = None

# CUDA, packed sequences (cu_seqlens): the two state passes by the same kernels compiled with varlen, one block per
# sequence, head and 64 value columns walking that sequence's chunks of the layout that starts every sequence on
# a chunk (chunk_offsets), with its own initial state and final-state gradient, instead of the torch passes
# sequence by sequence and chunk by chunk from Python. With STATES_AS_OPERANDS (the decay terms). On since its
# GPU tests passed (run 103); 96 packed sequences of random lengths, 32768 tokens, H = 32, forward + backward:
# KDA 222.6 ms without, 36.1 ms with; GDN 146.9 and 13.6 ms.
PACKED_STATE_KERNELS = True

# CUDA, where a chunk kernel follows the state-pass kernels: the passes write S and dS in the dtype the chunk
# kernels read them in (the inputs', not float32), and the reverse pass each chunk decay's gate term
# (decay sum S dS) from dS as its registers hold it (float32). No float32 copy of the two states in HBM, no
# rounding copies of them, no einsum over them: some 4 GB less traffic and 0.8 to 1.6 GB less peak memory at
# (1, 8192, 96, 128). GPU tests passed in run 100; GDN at (1, 8192, 96, 128), forward + backward: 10.32 ms
# without, 9.32 ms with, 2.7 GB peak memory against 3.7 GB.
STATES_AS_OPERANDS = True

# CUDA, KDA with the delta rule: chunk_pair_gradients compiled with shared_pairs, its two row sums against K
# sharing each pair's decay and each reference row's scaled K, its two column sums made one (about half the
# exponentials and shared loads of the pairs inside a sub-chunk). GPU tests passed in run 100; the kernel
# alone at (1, 8192, 96, 128): 18.09 ms without, 8.91 ms with; KDA forward + backward 27.96 ms with it alone.
SHARED_PAIR_SUMS = True

# CUDA, KDA: chunk_pair_gradients compiled with finish_gate writes the gate's gradient itself (each chunk
# decay's term on its last row, the reverse sum over the chunk, to_end's exclusive prefix sum: gate_gradient,
# one thread per channel) instead of rows that gate_gradient then pads, copies and sums in torch: some
# 8 GB of traffic at (1, 8192, 96, 128) by count. GPU tests passed in run 100; alone, KDA's time unchanged
# (37.84 ms) and its peak memory 5.4 GB against 6.6 GB.
GATE_IN_PAIR_KERNEL = True

# CUDA, the forward's pieces into the state-pass kernels: the kernels read them token-major, [B, T, H, D], as
# chunk_intra writes them (and do as it comes), instead of copies padded and laid out by chunks (about 4.5 GB
# of copies at (1, 8192, 96, 128) by count, and their memory). GPU tests passed in run 100; alone, KDA 35.44 ms
# and GDN 8.53 ms forward + backward at (1, 8192, 96, 128) (10.32 without). The four together: KDA 22.59 ms
# (37.88 before), 3.9 GB peak; GDN 7.30 ms, 2.2 GB (results/tuning/run100/).
TOKEN_MAJOR_STATES = True

# CUDA, KDA with the forward's pieces read token-major: chunk_pair_gradients' scores P taken from the forward's
# chunk_intra (its A_qk, which the state passes read already), chunk_pair_pieces compiled with scores=False:
# one of its two pair-score passes (three GEMMs and the pairs inside the sub-chunks, one by one) and the
# load of q gone. On since its GPU tests passed (run 103): KDA at (1, 8192, 96, 128), forward + backward, 22.22 ms
# without, 20.02 ms with.
SCORES_FROM_FORWARD = True

# CUDA, KDA: chunk_pair_gradients compiled for two blocks per SM (min_blocks=2: registers capped at 128, some
# 690 bytes spilled) instead of one block of 8 warps at 255 registers. Run 100's call timed the kernel alone at
# (1, 8192, 96, 128) with shared_pairs: 7.52 ms against 8.91 ms, the same outputs; with finish_gate (the
# default now) it has not run. KDA with the delta rule at DK = 128 only (what was compiled and timed). Its GPU
# tests passed (run 103; KDA 19.95 ms against 22.22), and it stays off: the split by channels below (which sets
# its own min_blocks) is faster.
PAIR_KERNEL_TWO_BLOCKS = False

# CUDA, KDA with the forward's pieces read token-major: all that chunk_pair_pieces made (the cumulative gate
# G, the inverse T, stril(K K^T E), the scores P) written by the forward's chunk_intra, compiled with
# backward_outputs, in the launch that makes the state passes' pieces, so that chunk_pair_pieces does not run:
# its loads of q, k and g, its two pair-score passes (the pairs inside the sub-chunks one by one) and its solve
# gone; the forward's kernel writes G, T and K K^T E besides (about 0.7 GB at (1, 8192, 96, 128), what
# chunk_pair_pieces wrote too). Implies the scores of SCORES_FROM_FORWARD. On since its GPU tests passed (run 103):
# KDA at (1, 8192, 96, 128), forward + backward, 18.28 ms with it alone against 22.22.
PAIR_PIECES_FROM_FORWARD = True

# CUDA, GDN (a gate per head, the delta rule) with the forward's pieces read token-major: the chunk kernel reads
# the inverse T, stril(K K^T E) and the scores P as the forward's chunk_intra writes them (compiled with
# backward_outputs, in the launch that makes the state passes' pieces) instead of making them again: no solve
# (its diagonal blocks one thread per column, then the block substitution), no K K^T and Q K^T GEMMs and their
# masks, for 32 KB more read per chunk and head. On since its GPU tests passed (run 103): GDN at (1, 8192, 96,
# 128), forward + backward, 6.83 ms without, 6.61 with (6.18 with GRADS_IN_INPUT_DTYPE too); the chunk kernel alone
# 2.48 ms against 2.52.
INVERSE_FROM_FORWARD = True

# CUDA: the chunk kernels compiled with the identities of kda.reference.backward.scalar_gate_reverse_walk (they hold
# for a gate per channel too): V' = T X, one product Y = T^T dV' for dV and dW, dA = -stril(Y V'^T). GDN's
# chunk_gradients makes 15 GEMMs a chunk instead of 20, KDA's chunk_state_gradients 9 instead of 14, dA with fewer
# roundings. GPU tests passed (run 153, H100: the chunk stages against float64, the ops' gradients against the
# recurrence); forward + backward at (1, 8192, 96, 128) 5.889 ms against 6.102 (GDN), 11.966 against 12.160 (KDA): on.
WALK_IDENTITIES = True

# CUDA, KDA: chunk_pair_gradients split by channels, PAIR_KERNEL_CHANNELS of them per block (every pair sum
# is per channel; only dPs and dAb, read again by each block, are shared), as fla's intra-chunk backward
# splits its own: tiles of 64 x 16 instead of 64 x 128, 117 registers for 128 threads against 255 for 256,
# so several blocks of 4 warps per SM instead of one of 8. On since its GPU tests passed (run 103, 16 channels).
# The kernel alone at (1, 8192, 96, 128), the same outputs bit for bit: 8.88 ms in one block, 6.13 by 16 channels,
# 5.96 by 32 for 3 blocks per SM, 5.15 by 32 for 4 (128 registers, 56 bytes spilled), 5.60 by 64 for 2, 9.03 by
# 32 with 256 threads; so 32 channels, 4 blocks.
PAIR_KERNEL_BY_CHANNELS = True
PAIR_KERNEL_CHANNELS = dict(block_dk=32, threads=128, min_blocks=4)

# CUDA, KDA: chunk_pair_gradients compiled with products: the pairs inside a sub-chunk (most of its work, one
# exponential per pair and channel) with each pair's decay a running product of the token decays, one exponential
# per token and channel, exact for any gate as before (the forward's PAIRWISE_BY_PRODUCTS, for the backward's four
# pair sums). More registers (the loops unrolled: 255 with the defaults, 205 split by 16 channels against 117).
# Its GPU tests passed (run 103), and it stays off: slower where timed (KDA forward + backward 24.18 ms against
# 22.22; the kernel alone by 16 channels 7.20 ms against 6.13).
PAIR_SUMS_BY_PRODUCTS = False

# CUDA, KDA with the delta rule: chunk_pair_gradients compiled with halve_to=PAIR_HALVINGS_TO: the pairs of
# different blocks of that many rows by halvings (halved_pair_sums: for blocks of 2h rows, h = 32, 16, .., the
# pairs across a block's two halves factor through the upper half's last row, both factors <= 1, four GEMMs per
# halving), only the pairs inside a block of PAIR_HALVINGS_TO rows one by one (3 of a row's 63 partners at most
# for 4, against 15 for the sub-chunks of 16). Exact for any gate, as the sub-chunks are. Its GPU tests passed (run
# 107: the chunk kernel against the stages, KDA's gradients, blocks of 16, 4 and 1 rows). Run 119 (H100, KDA forward +
# backward at (1, 8192, 96, 128), bf16): 14.16 ms off, 14.29 / 12.80 / 12.46 with blocks of 16 / 4 / 1 rows: on, to 1.
PAIR_SUMS_BY_HALVINGS = True
PAIR_HALVINGS_TO = 1

# CUDA, levels 1-3 with a gate per head or none (linear_attention, decay_attention, gated_attention with g
# [B, T, H]): what the state passes read made by level_pieces in the inputs' dtype and token-major, as the
# forward's chunk_intra makes it for level 5 (a per-head cumulative gate, two scalings, one batched GEMM for
# the scores), instead of the float32 torch stages by groups of chunks, their copies and concatenation; and
# the state passes compiled without the delta rule (W = 0: one GEMM of the forward pass's two, one of the
# reverse pass's four). Its GPU tests passed (run 103), and it stays off: LEVEL_PASSES_FROM_INPUTS below is
# faster (level 1 at (1, 8192, 96, 128), forward + backward: 11.62 ms by default before, 7.65 with this, 3.49
# with that).
LEVEL_PIECES = False

# CUDA, levels 1-3 with a gate per head or none, after LEVEL_PIECES: no pieces at all. The two state passes,
# compiled with gate_in, read the op's own q, k, v and do (token-major, the inputs' dtype) and each chunk's
# cumulative gate ([B, T, H, 1], float32, from one torch cumsum), and make K 2^(G_last - G), scale Q 2^G and the
# chunk decays themselves, one elementwise step per chunk before its GEMM; the chunk kernel reads the same
# inputs already. So the level backward is three launches and the gate's sums: no float32 copies of q and k, no
# scores P in HBM (the reverse pass without the delta rule never reads them). On since its GPU tests passed
# (run 103): forward + backward at (1, 8192, 96, 128), levels 1 / 2 / 3 per head, 11.62 / 10.57 / 10.77 ms
# without, 3.49 / 3.51 / 3.87 with (fla: 2.46 / 2.49 / -).
LEVEL_PASSES_FROM_INPUTS = True

# CUDA: the chunk kernel of a gate per head (GDN, levels 1-4) writes dq, dk and dv in the inputs' dtype, and
# KDA's chunk_state_gradients dv (each once, from float32 registers), instead of float32 tensors that the op
# then rounds, one copy each (about 0.14 ms apiece at (1, 8192, 96, 128) in run 100's profile); where no L2
# norm and no grouped value heads need them in float32 after the kernel. On since its GPU tests passed (run 103):
# forward + backward at (1, 8192, 96, 128), GDN 6.83 ms without, 6.36 with (peak 1.87 GB against 2.16); KDA
# 22.22 and 21.93 (3.68 GB against 3.87).
GRADS_IN_INPUT_DTYPE = True

# CUDA: what the two state passes read (W, U, the gated q and k, the scores, the decays) made by the
# forward's own chunk_intra kernel (kda.kernels.chunk_intra.prepare_chunks, one launch, bf16 or fp16) instead
# of torch stages by groups of chunks. GPU tests passed in run 93; KDA at (1, 8192, 96, 128), forward + backward:
# 249 ms without, 201 ms with.
FORWARD_PIECES = True

# CUDA: the chunk stage (every chunk's gradients) by the TileLang kernel of kda/kernels/backward_chunks.py
# for a gate per head (GDN) with the delta rule, chunks of 64, bf16 or fp16 inputs, dense or packed: one
# launch instead of torch stages by groups of chunks. GPU tests passed in run 93.
CHUNK_KERNEL = True

# CUDA: the chunk stage for a gate per channel (chunk_kda) by the three kernels of kda/kernels/backward_chunks.py
# that split it (chunk_pair_pieces, chunk_state_gradients, chunk_pair_gradients; kernel_chunk_gradients_by_channel),
# chunks of 64, bf16 or fp16 inputs, dense or packed: three launches instead of torch stages by groups of
# chunks. GPU tests passed in run 97; a step of forward and backward at (1, 8192, 96, 128), bf16, took 37.5 ms
# with them against 172.8 ms with the torch stages (run 96).
CHUNK_KERNELS_BY_CHANNEL = True

# Bytes that one group of chunks may take for its pairwise decay tables and their temporaries; None:
# on CUDA a quarter of the device's free memory, between 1 and 16 GiB (every group is a few hundred
# launches whatever its size, and at (1, 8192, 96, 128) 2 GiB made 32 groups of 4 chunks), else 2 GiB.
MEMORY_BUDGET = None
CHUNK_SIZE = 64

# What the two state passes read, kept for every chunk (W, U, the gated q and k, the scores, the decay).
STATE_PIECES = ("U", "W", "Kd", "Qg", "P", "decay")


@contextlib.contextmanager
def full_float32_matmuls():
    """float32 products in float32, whatever the caller set (a training script's TF32 would round
    the stages' operands to 10 bits)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


# --8<-- [start:sub_chunked]
class SubChunked:
    """``kda.reference.backward.Pairwise``'s three sums with the decays of a gate per channel factored
    through one reference row per block of ``BLOCK`` rows (the forward's kernels take the row before the
    block; here its first row): for ``i`` in a block that starts at row ``r`` and ``j < r``,
    ``E_ijd = exp(G_id - G_rd) exp(G_rd - G_jd)``, both factors ``<= 1``, so the block's sums are matrix
    products of gated rows; only the pairs inside a block are formed pairwise (``C x BLOCK x DK``
    numbers per chunk instead of ``C x C x DK``). A factor that underflows stands for a product smaller
    still, so nothing is lost that float32 would keep. Every block is done at once (a block dimension
    ``nb`` beside the chunk's: one launch per product instead of one per block and product); a chunk
    whose rows are not a whole number of blocks is padded with rows of constant gate and zero data. A
    gate per head (width 1) needs none of it: ``Pairwise``'s products."""

    BLOCK = 16

    def __init__(self, G):
        self.whole = stages.Pairwise(G) if G.shape[-1] == 1 else None
        if self.whole is not None:
            return
        C, b = G.shape[-2], self.BLOCK
        self.C, self.nb = C, -(-C // b)
        Gb = self._blocks(torch.cat([G, G[..., -1:, :].expand(*G.shape[:-2], self.nb * b - C, G.shape[-1])], -2))
        Gr = Gb[..., :1, :]                                                  # [..., nb, 1, D]: each block's first row
        self.down = torch.exp(Gb - Gr)                                       # [..., nb, b, D], rows below r
        # exp(G_r - G_j) for the rows j before the block, [..., nb, C, D]; 0 from the block's first row on
        before = torch.arange(C, device=G.device) < torch.arange(0, C, b, device=G.device)[:, None]
        self.up = torch.where(before[..., None], torch.exp(torch.clamp(Gr - G[..., None, :, :], max=0.0)), 0.0)
        inside = torch.ones(b, b, dtype=torch.bool, device=G.device).tril()[..., None]
        self.pairs = torch.where(inside, torch.exp(torch.where(inside, Gb[..., :, None, :] - Gb[..., None, :, :], 0.0)),
                                 0.0)                                        # [..., nb, b, b, D], j <= i
        self.pad = self.nb * b - C

    def _blocks(self, x):
        """``[..., nb * BLOCK, D]`` as ``[..., nb, BLOCK, D]``."""
        return x.reshape(*x.shape[:-2], self.nb, self.BLOCK, x.shape[-1])

    def _padded(self, x):
        return torch.nn.functional.pad(x, (0, 0, 0, self.pad)) if self.pad else x

    def _diagonal_blocks(self, s):
        """The ``BLOCK x BLOCK`` blocks on the diagonal of ``s [..., C, C]``: ``[..., nb, BLOCK, BLOCK]``."""
        s = torch.nn.functional.pad(s, (0, self.pad, 0, self.pad)) if self.pad else s
        b, nb = self.BLOCK, self.nb
        return s.reshape(*s.shape[:-2], nb, b, nb, b).diagonal(dim1=-4, dim2=-2).movedim(-1, -3)

    def scores(self, x, y, diagonal=True):
        if self.whole:
            return self.whole.scores(x, y, diagonal)
        xd = self._blocks(self._padded(x)) * self.down                       # [..., nb, b, D]
        out = xd @ (y[..., None, :, :] * self.up).transpose(-1, -2)          # [..., nb, b, C]: j before the block
        yb = self._blocks(self._padded(y))
        inner = (self._blocks(self._padded(x))[..., :, None, :] * yb[..., None, :, :] * self.pairs).sum(-1)
        if not diagonal:
            inner = inner.tril(-1)
        out = torch.nn.functional.pad(out, (0, self.pad)) if self.pad else out
        out = out.reshape(*out.shape[:-3], self.nb, self.BLOCK, self.nb, self.BLOCK)
        out.diagonal(dim1=-4, dim2=-2).add_(inner.movedim(-3, -1))           # the pairs inside each block
        return out.reshape(*out.shape[:-4], self.nb * self.BLOCK, -1)[..., :self.C, :self.C]

    def rows(self, s, y):
        if self.whole:
            return self.whole.rows(s, y)
        sb = self._blocks(self._padded(s))                                   # [..., nb, b, C]
        out = self.down * (sb @ (y[..., None, :, :] * self.up))             # up is 0 inside and after the block
        yb = self._blocks(self._padded(y))
        inner = (self._diagonal_blocks(s)[..., None] * self.pairs * yb[..., None, :, :]).sum(-2)
        return self._padded_back(out + inner)

    def cols(self, s, x):
        if self.whole:
            return self.whole.cols(s, x)
        sb = self._blocks(self._padded(s))                                   # [..., nb, b, C]
        xd = self._blocks(self._padded(x))
        out = (self.up * (sb.transpose(-1, -2) @ (xd * self.down))).sum(-3)  # [..., C, D]
        inner = (self._diagonal_blocks(s)[..., None] * self.pairs * xd[..., :, None, :]).sum(-3)
        return out + self._padded_back(inner)

    def _padded_back(self, blocks):
        """``[..., nb, BLOCK, D]`` as the chunk's ``[..., C, D]``."""
        return blocks.reshape(*blocks.shape[:-3], -1, blocks.shape[-1])[..., :self.C, :]
# --8<-- [end:sub_chunked]


# --8<-- [start:l2_normalize_backward]
def l2_normalize_backward(x: torch.Tensor, dn: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The gradient through ``n = x / sqrt(|x|^2 + eps)`` (``use_qk_l2norm_in_kernel``):
    ``dx = r dn - r^3 x (x . dn)``, ``r = (|x|^2 + eps)^(-1/2)``."""
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
    return r * dn - r ** 3 * x * (x * dn).sum(-1, keepdim=True)
# --8<-- [end:l2_normalize_backward]


def chunk_groups(B: int, H: int, NC: int, C: int, DK: int, DV: int, width: int,
                 budget: int = None) -> list[tuple[int, int]]:
    """Ranges of chunks whose work stays within ``budget`` bytes in float32: per chunk and head, the
    pairwise tables inside the sub-chunks (``[C, BLOCK, width]``, ``width`` ``DK`` or 1 for a gate per
    head, with about six temporaries of that size) and about sixteen ``[C, DK + DV]`` tensors."""
    per_chunk = B * H * C * (SubChunked.BLOCK * width * 8 + (DK + DV) * 16) * 4
    n = max(1, (budget if budget is not None else memory_budget()) // per_chunk)
    return [(s, min(s + n, NC)) for s in range(0, NC, n)]


def memory_budget(device=None) -> int:
    """``MEMORY_BUDGET``, or where it is ``None`` what the module's comment says for ``device``
    (the current CUDA device if there is one)."""
    if MEMORY_BUDGET is not None:
        return MEMORY_BUDGET
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return 2 << 30
    free, _ = torch.cuda.mem_get_info(device)
    return min(max(free // 4, 1 << 30), 16 << 30)


def packed_layout(bounds: list[int], C: int, device) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """For sequences ``bounds`` (``cu_seqlens`` on the host): the position in the padded layout of
    every token (each sequence starts at a chunk boundary) and each sequence's range of chunks."""
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    ends = torch.tensor([ceildiv(n, C) for n in lengths], dtype=torch.long).cumsum(0).tolist()
    segments = list(zip([0] + ends[:-1], ends))
    # token t of a sequence that starts at token s and chunk c lands at c C + (t - s)
    shift = torch.tensor([c * C - s for (c, _), s in zip(segments, bounds)], dtype=torch.long)
    where = torch.arange(bounds[-1] if bounds else 0) + shift.repeat_interleave(torch.tensor(lengths, dtype=torch.long))
    return where.to(device), segments


# --8<-- [start:chunked_gradients]
def chunked_gradients(q, k, v, g, beta, do, dht, scale, h0, segments=None, chunk_size=CHUNK_SIZE,
                      dtype=torch.float32, budget=None, kernel_dtype=None, final_dtype=False):
    """``dq, dk, dv, dg, dbeta, dh0`` of ``sum(o * do) + sum(S_final * dht)``, all ``[B, T, H, *]``
    with one key head per value head, in ``dtype``. ``segments``: the chunk ranges of packed
    sequences (``B = 1``; ``h0`` and ``dht`` then ``[N, H, DK, DV]``), ``None`` for one sequence per
    batch row. ``g`` ``[B, T, H(, DK)]`` or ``None``; ``beta`` ``None`` without a delta rule.
    ``kernel_dtype``: the inputs' dtype, for the chunk kernel where it applies (``CHUNK_KERNEL``);
    ``final_dtype``: that kernel writes ``dq, dk, dv`` in ``kernel_dtype`` (``GRADS_IN_INPUT_DTYPE``)."""
    B, T, H, DK = q.shape
    DV, C = v.shape[-1], chunk_size
    NC = ceildiv(T, C)
    segments = segments if segments is not None else [(0, NC)]
    N = len(segments) * B
    S0 = h0.to(dtype) if h0 is not None else q.new_zeros(N, H, DK, DV, dtype=dtype)
    dS_final = dht.to(dtype) if dht is not None else torch.zeros_like(S0)
    if NC == 0:                                              # no token: the final state is the initial one
        zero = lambda x: torch.zeros_like(x, dtype=dtype) if x is not None else None
        return zero(q), zero(k), zero(v), zero(g), zero(beta), dS_final.clone()
    pick = lambda x, s, e: x[:, s * C:e * C] if x is not None else None
    width = g.shape[-1] if g is not None and g.dim() == 4 else 1
    pieces = lambda s, e: stages.chunk_pieces(*(pick(x, s, e) for x in (q, k, v, g, beta)), scale, C, dtype,
                                              SubChunked)
    chunk_kernel = chunk_kernel_applies(q, g, beta, C, kernel_dtype)
    channel_kernels = channel_kernels_apply(q, g, beta, C, kernel_dtype, DV)
    # 1. what the state passes read, for every chunk: by the forward's kernel, or a group of chunks at
    # a time (one group, step 3 by torch: its pieces are kept for step 3 instead of made again)
    first = None
    packed = len(segments) > 1
    # packed sequences: the kernels with the decay terms only (what they were compiled and tested for)
    state_kernels = state_kernels_apply(q, DV, packed) and (
        not packed or (STATES_AS_OPERANDS and (chunk_kernel or channel_kernels)))
    from_forward = forward_pieces_apply(q, beta, C, kernel_dtype)
    from_inputs = level_passes_apply(q, g, beta, C, kernel_dtype, DV, packed)
    from_level = not from_inputs and level_pieces_apply(q, g, beta, C, kernel_dtype, DV, packed)
    # the torch stages' groups of chunks, only where a torch stage runs (the budget asks the device's free memory)
    torch_stages = not (from_inputs or from_forward or from_level) or not (chunk_kernel or channel_kernels)
    groups = chunk_groups(B, H, NC, C, DK, DV, width, budget if budget is not None else memory_budget(q.device)) \
        if torch_stages else None
    token_major = TOKEN_MAJOR_STATES and state_kernels and (from_forward or from_level) or from_inputs
    # KDA's chunk kernels reading all that the forward's kernel made of the pairs (else at most its scores)
    pairs_from_forward = PAIR_PIECES_FROM_FORWARD and token_major and channel_kernels and from_forward
    # GDN's chunk kernel reading the forward's inverse, K K^T E and scores
    inverse_from_forward = INVERSE_FROM_FORWARD and token_major and chunk_kernel and from_forward
    if from_inputs:
        whole = None              # the state kernels read q, k, v and do themselves
    elif from_forward:
        # in kernel_dtype, as the kernel wrote them; token-major ([B, T, H, *]) for the state kernels to read
        whole = forward_pieces(q, k, v, g, beta, scale, kernel_dtype, token_major,
                               pairs_from_forward or inverse_from_forward)
    elif from_level:
        whole = level_pieces(q, k, v, g, scale, kernel_dtype)
    else:
        first = pieces(*groups[0]) if len(groups) == 1 and not (chunk_kernel or channel_kernels) else None
        kept = [first] if first else [{name: p[name] for name in STATE_PIECES}
                                      for p in (pieces(s, e) for s, e in groups)]
        whole = {name: torch.cat([part[name] for part in kept], dim=2) for name in STATE_PIECES}
        del kept
    dO = do if token_major else to_chunks(do, C)   # in do's dtype: the state kernels round it to theirs
    # 2. the states entering every chunk and the gradients of those leaving it
    dG_last = None          # each chunk decay's gate term, where the reverse pass makes it
    if from_inputs:
        from kda.kernels.backward_states import run_state_passes_from_inputs

        S, dS, dh0, dG_last = run_state_passes_from_inputs(q, k, v, g, do, S0, dS_final, scale, STATES_AS_OPERANDS)
    elif state_kernels:
        as_operands = STATES_AS_OPERANDS and (chunk_kernel or channel_kernels)
        S, dS, dh0, dG_last = kernel_state_passes(whole, S0, dO, dS_final, kernel_dtype, as_operands, token_major,
                                                  delta_rule=not from_level, segments=segments if packed else None)
    else:
        S, dS, dh0 = torch_state_passes({name: x.to(dtype) for name, x in whole.items()}, S0, dO.to(dtype),
                                        dS_final, segments)
    # the forward's scores A_qk, [B, T, H, C] as chunk_intra wrote them, for the chunk kernels of KDA
    scores = whole["P"] if (SCORES_FROM_FORWARD or pairs_from_forward) and token_major and channel_kernels else None
    pair_pieces = {name: whole[name] for name in ("G", "Tinv", "KKE")} if pairs_from_forward else None
    inverse = {name: whole[name] for name in ("Tinv", "KKE", "P")} if inverse_from_forward else None
    del whole
    # 3. every chunk's gradients: in one launch (a gate per head), or a group of chunks at a time
    if chunk_kernel:
        gate = g if g is not None else torch.zeros(q.shape[:3], dtype=q.dtype, device=q.device)
        dq, dk, dv, dg, dbeta = kernel_chunk_gradients(q, k, v, gate, beta, do, S, dS, scale, kernel_dtype, dG_last,
                                                       final_dtype, inverse)
        return dq, dk, dv, (dg if g is not None else None), dbeta, dh0
    if channel_kernels:
        return (*kernel_chunk_gradients_by_channel(q, k, v, g, beta, do, S, dS, scale, kernel_dtype, dG_last, scores,
                                                   final_dtype, pair_pieces), dh0)
    dO = dO.to(dtype)
    out = [stages.chunk_gradients(first or pieces(s, e), S[:, :, s:e], dS[:, :, s:e], dO[:, :, s:e])
           for s, e in groups]
    dQ, dK, dV, dg = (torch.cat([o[i] for o in out], dim=2) for i in (0, 1, 2, 4))
    if g is not None:
        dg = from_chunks(dg, T)
        dg = dg if g.dim() == 4 else dg[..., 0]
    else:
        dg = None
    dbeta = from_chunks(torch.cat([o[3] for o in out], dim=2)[..., None], T)[..., 0] if beta is not None else None
    return from_chunks(dQ, T) * scale, from_chunks(dK, T), from_chunks(dV, T), dg, dbeta, dh0
# --8<-- [end:chunked_gradients]


def kernels_take(q, C, kernel_dtype) -> bool:
    """What every kernel of the backward's stages needs: CUDA, chunks of 64, inputs in bf16 or fp16 (with
    or without the delta rule: the chunk kernels are compiled for either)."""
    return q.is_cuda and C == 64 and kernel_dtype in (torch.bfloat16, torch.float16)


def forward_pieces_apply(q, beta, C, kernel_dtype) -> bool:
    """Whether step 1 of ``chunked_gradients`` runs as the forward's ``chunk_intra`` (``FORWARD_PIECES``):
    what ``kernels_take`` says, with the delta rule (the forward's pieces are those of level 5)."""
    return FORWARD_PIECES and beta is not None and kernels_take(q, C, kernel_dtype)


def forward_pieces(q, k, v, g, beta, scale, dtype, token_major=False, pair_pieces=False):
    """``STATE_PIECES`` for every chunk ``[B, H, NC, C, *]`` from ``kda.kernels.chunk_intra.prepare_chunks`` (the
    forward's ``chunk_intra``) on the inputs rounded to ``dtype``: ``Qg`` is its ``Qw`` (scale in), ``Kd`` its
    ``Kw``, ``P`` its ``A_qk``; the rows past the end are zeros, as the torch pieces' are. ``g``: ``[B, T, H,
    DK]``, ``[B, T, H]`` (a gate per head) or ``None`` (none: a zero gate per head). ``token_major``: the
    pieces as the kernel wrote them, ``[B, T, H, *]`` (``decay`` ``[B, H, NC, DK]`` either way).
    ``pair_pieces`` (``PAIR_PIECES_FROM_FORWARD``): also ``G``, ``Tinv`` and ``KKE`` as ``chunk_pair_pieces``
    writes them, from the kernel compiled with ``backward_outputs``."""
    from kda.kernels.chunk_intra import prepare_chunks

    B, T, H, _ = q.shape
    NC = ceildiv(T, CHUNK_SIZE)
    gate = torch.zeros(B, T, H, 1, device=q.device) if g is None else (g[..., None] if g.dim() == 3 else g)
    low = lambda x: x.to(dtype).contiguous()
    made = prepare_chunks(low(q), low(k), low(v), gate.float().contiguous(), beta, scale,
                          **({"backward_outputs": True} if pair_pieces else {}))
    form, extra = (made[0], dict(zip(("G", "Tinv", "KKE"), made[1:]))) if pair_pieces else (made, {})
    chunked = (lambda x: x) if token_major else lambda x: torch.nn.functional.pad(
        x, (0, 0, 0, 0, 0, NC * CHUNK_SIZE - T)).view(B, NC, CHUNK_SIZE, H, x.shape[-1]).permute(0, 3, 1, 2, 4)
    return {"U": chunked(form.U), "W": chunked(form.W), "Kd": chunked(form.Kw), "Qg": chunked(form.Qw),
            "P": chunked(form.A_qk), "decay": form.decay, **extra}


def state_kernels_apply(q, DV, packed) -> bool:
    """Whether step 2 of ``chunked_gradients`` runs as the state-pass kernels (``STATE_KERNELS``): CUDA, a
    dense batch (or packed sequences with ``PACKED_STATE_KERNELS``), values in blocks of 64."""
    return STATE_KERNELS and q.is_cuda and (not packed or PACKED_STATE_KERNELS) and DV % 64 == 0


def level_pieces_apply(q, g, beta, C, kernel_dtype, DV, packed) -> bool:
    """Whether step 1 of ``chunked_gradients`` runs as ``level_pieces`` (``LEVEL_PIECES``): what
    ``kernels_take`` says, no delta rule and a gate per head or none (levels 1, 2 and 3 with ``g [B, T, H]``),
    and the state kernels reading them token-major (a dense batch, values in blocks of 64)."""
    return (LEVEL_PIECES and beta is None and (g is None or g.dim() == 3) and kernels_take(q, C, kernel_dtype)
            and state_kernels_apply(q, DV, packed) and TOKEN_MAJOR_STATES)


def level_passes_apply(q, g, beta, C, kernel_dtype, DV, packed) -> bool:
    """Whether steps 1 and 2 of ``chunked_gradients`` run as the state kernels reading the op's inputs
    (``LEVEL_PASSES_FROM_INPUTS``): no delta rule, a gate per head or none, the state kernels for a dense batch,
    and the chunk kernel after them (step 3 then reads the same inputs; it makes no pieces for torch stages)."""
    return (LEVEL_PASSES_FROM_INPUTS and beta is None and (g is None or g.dim() == 3) and not packed
            and state_kernels_apply(q, DV, packed) and chunk_kernel_applies(q, g, beta, C, kernel_dtype))


def level_pieces(q, k, v, g, scale, dtype):
    """``STATE_PIECES`` without the delta rule for a gate per head ``g [B, T, H]`` (natural log) or none,
    token-major ``[B, T, H, *]`` in ``dtype`` as ``forward_pieces`` gives them with ``token_major``: ``Qg =
    scale q e^G``, ``Kd = k e^(G_last - G)``, the scores ``P = scale tril(Q K^T) e^(G_i - G_j)`` per chunk,
    ``W = 0``, ``U = v``, ``decay = e^G_last [B, H, NC, DK]`` (float32). ``G`` is the cumulative gate within
    each chunk, float32; every exponent is ``<= 0`` (the scores' masked before it is taken)."""
    B, T, H, DK = q.shape
    C = CHUNK_SIZE
    gate = torch.zeros(B, T, H, device=q.device) if g is None else g.float()
    G = to_chunks(gate[..., None], C).cumsum(-2)                           # [B, H, NC, C, 1], flat past T
    Qg = (q.float() * (scale * from_chunks(torch.exp(G), T))).to(dtype)
    Kd = (k.float() * from_chunks(torch.exp(G[..., -1:, :] - G), T)).to(dtype)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decays = torch.exp(torch.where(causal, G - G.transpose(-1, -2), float("-inf")))       # [B, H, NC, C, C]
    P = to_chunks(q.float(), C) @ to_chunks(k.float(), C).transpose(-1, -2)              # rounded once, below
    P = from_chunks(P * decays * scale, T).to(dtype)
    decay = torch.exp(G[..., -1, :]).expand(B, H, G.shape[2], DK).contiguous()
    return {"U": v.to(dtype).contiguous(), "W": torch.zeros_like(Kd), "Kd": Kd, "Qg": Qg, "P": P, "decay": decay}


def chunk_kernel_applies(q, g, beta, C, kernel_dtype) -> bool:
    """Whether step 3 of ``chunked_gradients`` runs as ``kda.kernels.backward_chunks`` (``CHUNK_KERNEL``):
    what ``kernels_take`` says, and a gate per head or none. Packed sequences too: laid out from chunk
    boundaries (``packed_layout``), the rows between two sequences are zeros with a zero gate and
    ``b = 0``, which add nothing to any real row."""
    return CHUNK_KERNEL and (g is None or g.dim() == 3) and kernels_take(q, C, kernel_dtype)


def channel_kernels_apply(q, g, beta, C, kernel_dtype, DV) -> bool:
    """Whether step 3 of ``chunked_gradients`` runs as the three kernels for a gate per channel
    (``CHUNK_KERNELS_BY_CHANNEL``): what ``kernels_take`` says, a gate ``[B, T, H, DK]``, and heads of at
    most 128 (``chunk_state_gradients`` holds a ``DK x DV`` state and four ``C x DV`` tiles in shared
    memory: at ``DV = 256`` it would need some 290 KB of the 227 KB an SM has)."""
    return (CHUNK_KERNELS_BY_CHANNEL and g is not None and g.dim() == 4 and q.shape[-1] <= 128 and DV <= 128
            and kernels_take(q, C, kernel_dtype))


def gate_gradient(dG, to_end, dG_last, C):
    """The gate's gradient per token ``[B, T, H(, DK)]`` from the chunk kernels' rows (``dG``: every term
    but the decay to the chunk's end; ``to_end``: that decay's terms; both ``[B, T, H]`` for a gate per
    head, ``[B, T, H, DK]`` per channel) and each chunk's ``dG_last [B, H, NC(, DK)]`` (the state's
    decay): as ``kda.reference.backward.chunk_gradients`` ends, ``dG_last`` on the chunk's last row, the
    reverse sum within the chunk, then ``to_end`` as an exclusive prefix sum."""
    B, T, H = dG.shape[:3]
    rest = dG.shape[3:]
    NC = ceildiv(T, C)
    chunks = lambda x: torch.nn.functional.pad(x, (0, 0) * (1 + len(rest)) + (0, NC * C - T)).view(B, NC, C, H, *rest)
    dG, to_end = chunks(dG).clone(), chunks(to_end)
    dG[:, :, -1] += dG_last.transpose(1, 2)
    return stages.gate_from_rows(dG, to_end, dim=2).reshape(B, NC * C, H, *rest)[:, :T]


def kernel_chunk_gradients(q, k, v, g, beta, do, S, dS, scale, dtype, dG_last=None, final_dtype=False, inverse=None):
    """Step 3 of ``chunked_gradients`` by ``kda.kernels.backward_chunks.run_chunk_gradients`` (a gate per head
    ``g [B, T, H]``): ``dq`` (scale in), ``dk``, ``dv``, ``dg``, ``dbeta`` (float32, ``[B, T, H, *]``; ``dbeta``
    ``None`` without the delta rule, ``beta=None``). ``dG_last [B, H, NC, DK]``: the chunk decays' gate terms
    where the reverse pass made them (``STATES_AS_OPERANDS``), else taken here from ``S`` and ``dS``.
    ``final_dtype``: ``dq, dk, dv`` in ``dtype``, as the kernel rounds them once (``GRADS_IN_INPUT_DTYPE``).
    ``inverse``: the forward's ``Tinv``, ``KKE`` and ``P`` (``INVERSE_FROM_FORWARD``)."""
    from kda.kernels.backward_chunks import run_chunk_gradients

    B, T, H, _ = q.shape
    dq, dk, dv, db, dG, to_end = run_chunk_gradients(q, k, v, g, beta, do, S, dS, scale, dtype, final_dtype, inverse,
                                                     WALK_IDENTITIES)
    NC = S.shape[2]
    if dG_last is not None:
        dG_last = dG_last.sum(3)                                                       # a gate per head
    else:
        G_last = torch.nn.functional.pad(g.float(), (0, 0, 0, NC * CHUNK_SIZE - T)).view(B, NC, CHUNK_SIZE, H).sum(2)
        dG_last = torch.einsum("bhnkv,bhnkv->bhn", S, dS) * torch.exp(G_last).transpose(1, 2)   # [B, H, NC]
    return dq, dk, dv, gate_gradient(dG, to_end, dG_last, CHUNK_SIZE), (db if beta is not None else None)


def pair_kernel_options(beta, DK: int) -> dict:
    """``chunk_pair_gradients``' compile flags by this module's switches: the two pair sums sharing their decays
    (``SHARED_PAIR_SUMS``, with the delta rule), the gate finished in the kernel (``GATE_IN_PAIR_KERNEL``), the
    pairs inside a sub-chunk by halvings (with shared sums) or by products or one by one, and the blocks'
    arrangement (``PAIR_KERNEL_TWO_BLOCKS``, ``PAIR_KERNEL_CHANNELS``)."""
    shared = dict(shared_pairs=True) if SHARED_PAIR_SUMS and beta is not None else {}
    finish = dict(finish_gate=True) if GATE_IN_PAIR_KERNEL else {}
    inside = dict(halve_to=PAIR_HALVINGS_TO) if PAIR_SUMS_BY_HALVINGS and shared else \
        dict(products=True) if PAIR_SUMS_BY_PRODUCTS else {}
    blocks = {**(dict(min_blocks=2) if PAIR_KERNEL_TWO_BLOCKS and beta is not None and DK == 128 else {}),
              **(PAIR_KERNEL_CHANNELS if PAIR_KERNEL_BY_CHANNELS else {}), **inside}
    return {**shared, **finish, **blocks}


def kernel_chunk_gradients_by_channel(q, k, v, g, beta, do, S, dS, scale, dtype, dG_last=None, scores=None,
                                      final_dtype=False, pair_pieces=None):
    """Step 3 of ``chunked_gradients`` for a gate per channel (KDA) by
    ``kda.kernels.backward_chunks.run_channel_gradients``, its pair kernel compiled by this module's switches
    (``pair_kernel_options``): ``dq`` (scale in), ``dk``, ``dv``, ``dg [B, T, H, DK]``, ``dbeta``, float32
    (``dbeta`` ``None`` without the delta rule). ``scores`` (``SCORES_FROM_FORWARD``) and ``pair_pieces``
    (``PAIR_PIECES_FROM_FORWARD``): what the forward's ``chunk_intra`` made; ``final_dtype``: ``dv`` in ``dtype``
    (``GRADS_IN_INPUT_DTYPE``)."""
    from kda.kernels.backward_chunks import run_channel_gradients

    options = pair_kernel_options(beta, q.shape[-1])
    dq, dk, dv, dG, to_end, dG_last, db = run_channel_gradients(q, k, v, g, beta, do, S, dS, scale, dtype, options,
                                                                dG_last, scores, final_dtype, pair_pieces,
                                                                WALK_IDENTITIES)
    dg = dG if options.get("finish_gate") else gate_gradient(dG, to_end, dG_last, CHUNK_SIZE)
    return dq, dk, dv, dg, (db if beta is not None else None)


def torch_state_passes(whole, S0, dO, dS_final, segments):
    """``forward_states`` and ``reverse_state_pass`` sequence by sequence (``segments``, each a range of
    chunks of one batch row, or of all rows of a dense batch): the states entering every chunk, the
    gradients of those leaving it and that of each initial state."""
    B, H, NC, DK, DV = *whole["W"].shape[:3], *S0.shape[-2:]
    S, dS = (S0.new_zeros(B, H, NC, DK, DV) for _ in range(2))
    dh0 = dS_final.clone()                                   # an empty sequence's state passes through
    for n, (s, e) in enumerate(segments):
        if e == s:
            continue
        rows = slice(n, n + 1) if len(segments) > 1 else slice(None)   # packed: one state per sequence
        part = {name: x[:, :, s:e] for name, x in whole.items()}
        S[:, :, s:e] = stages.forward_states(part, S0[rows])[0]
        dS[:, :, s:e], dh0[rows] = stages.reverse_state_pass(part, dO[:, :, s:e], dS_final[rows])
    return S, dS, dh0


def kernel_state_passes(whole, S0, dO, dS_final, inputs_dtype=None, as_operands=False, token_major=False,
                        delta_rule=True, segments=None):
    """``forward_states`` and ``reverse_state_pass`` by ``kda.kernels.backward_states.run_state_passes``, the
    pieces rounded to ``STATE_KERNELS_DTYPE``, or where that is None to the inputs' dtype if it is bf16 or fp16
    (else bf16). ``as_operands`` (``STATES_AS_OPERANDS``), ``token_major`` (``TOKEN_MAJOR_STATES``),
    ``delta_rule`` and ``segments`` (``PACKED_STATE_KERNELS``) as that function takes them."""
    from kda.kernels.backward_states import run_state_passes

    halves = (torch.bfloat16, torch.float16)
    operands = STATE_KERNELS_DTYPE or (inputs_dtype if inputs_dtype in halves else torch.bfloat16)
    return run_state_passes(whole, S0, dO, dS_final, operands, as_operands, token_major, delta_rule, segments)


# --8<-- [start:op_gradients]
def op_gradients(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, do, dht, budget=None,
                 dtype=torch.float32, cu_seqlens_cpu=None):
    """The gradients of the op ``kda::chunk_gated_delta`` (``chunk_kda``, ``chunk_gated_delta_rule``)
    in its arguments' layouts and dtypes: ``[dq, dk, dv, dg, dbeta]``, then ``dh0`` when there is an
    initial state. With ``g=None`` (no gate) or ``beta=None`` (no delta rule) the same stages give the
    level 1-4 functions' gradients (``kda.cuda_autograd.LevelGradients``), ``None`` in their places.
    Grouped value heads, packed sequences (``cu_seqlens``), the L2 norm of ``q`` and ``k`` in the op and a
    gate ``[B, T, H]``, ``[B, T, H, 1]`` or ``[B, T, H, DK]`` included. Computed
    in ``dtype`` (float32 on CUDA; float64 shows the arithmetic exact). ``cu_seqlens_cpu``, the
    boundaries' host copy where the caller has one, spares the read-back."""
    B, T, HQ, DK = q.shape
    H = v.shape[2]
    f32 = lambda x: x.to(dtype) if x is not None else None
    gate = f32(g[..., 0] if g is not None and g.dim() == 4 and g.shape[-1] == 1 else g)
    # where the kernels take every step, q, k, v and do stay in the inputs' dtype, as the kernels read
    # them (float32 copies of four [B, T, H, D] tensors would only be rounded back); else float32
    chunk_kernels = chunk_kernel_applies(q, gate, beta, CHUNK_SIZE, q.dtype) or channel_kernels_apply(
        q, gate, beta, CHUNK_SIZE, q.dtype, v.shape[-1])
    packed = cu_seqlens is not None
    kernels = chunk_kernels and (forward_pieces_apply(q, beta, CHUNK_SIZE, q.dtype) or level_pieces_apply(
        q, gate, beta, CHUNK_SIZE, q.dtype, v.shape[-1], packed) or level_passes_apply(
        q, gate, beta, CHUNK_SIZE, q.dtype, v.shape[-1], packed))
    own = (lambda x: x.to(q.dtype)) if kernels else f32
    if use_qk_l2norm and kernels:                            # in the inputs' dtype, as the forward normalizes
        from kda.gated_delta import l2_normalized            # (by the norm's kernel with L2NORM_KERNEL)

        qn, kn = l2_normalized(q), l2_normalized(k)
    else:
        qn, kn = (own(l2_normalize(f32(x))) for x in (q, k)) if use_qk_l2norm else (own(q), own(k))
    group = H // HQ                                          # value head i reads key head i // group
    qn, kn = repeat_to_value_heads(qn, kn, H)
    args = [qn, kn, own(v), gate, f32(beta), own(do)]
    segments = None
    if cu_seqlens is not None:                               # end to end, each sequence from a chunk boundary
        bounds = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).tolist()
        where, segments = packed_layout(bounds, CHUNK_SIZE, q.device)
        length = segments[-1][1] * CHUNK_SIZE if segments else 0
        spread = lambda x: x.new_zeros(1, length, *x.shape[2:]).index_copy_(1, where, x)
        args = [spread(x) if x is not None else None for x in args]
    # the chunk kernel's dq, dk, dv rounded once, in the kernel, where nothing after it needs them in float32
    final_dtype = GRADS_IN_INPUT_DTYPE and group == 1 and not use_qk_l2norm and chunk_kernels
    with full_float32_matmuls():
        dq, dk, dv, dg, dbeta, dh0 = chunked_gradients(*args[:5], args[5], f32(dht), scale, f32(initial_state),
                                                       segments, budget=budget, dtype=dtype, kernel_dtype=q.dtype,
                                                       final_dtype=final_dtype)
    if cu_seqlens is not None:
        pick = lambda x: x.index_select(1, where) if x is not None else None
        dq, dk, dv, dg, dbeta = (pick(x) for x in (dq, dk, dv, dg, dbeta))
    if group > 1:                                            # a key head's gradient: the sum over its value heads
        dq, dk = (x.view(B, T, HQ, group, DK).sum(3) for x in (dq, dk))
    if use_qk_l2norm:
        dq, dk = l2_normalize_backward(f32(q), dq), l2_normalize_backward(f32(k), dk)
    grads = [dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
             dg.reshape(g.shape).to(g.dtype) if g is not None else None,
             dbeta.to(beta.dtype) if beta is not None else None]
    return grads + ([dh0.to(initial_state.dtype)] if initial_state is not None else [])
# --8<-- [end:op_gradients]
