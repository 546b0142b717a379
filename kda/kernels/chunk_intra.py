"""The intra-chunk stage of the gated delta rule (KDA; GDN is its scalar-gate case), over all chunks at once.

Per chunk, with ``G`` the chunk-local cumsum of the gate in log2 units and ``b`` the step sizes,
the chunk form computed here is

* ``A_kk = tril(diag(b) (K 2^G)(K 2^-G)^T, -1)`` and ``T = (I + A_kk)^-1``,
* ``W = T diag(b) (K 2^G)`` and ``U = T diag(b) V``,
* ``V_new = U - W S``, ``O = (scale Q 2^G) S + A_qk V_new``,
* ``S <- diag(2^G_last) S + (K 2^(G_last - G))^T V_new``.

The first of two stages:

1. ``chunk_intra``, all chunks at once, from one load of ``q, k, v, g, beta``: the cumsum (and
   the range checks of ``g`` and ``beta``), ``Qw = scale Q 2^G``, ``Kw = K 2^(G_last - G)``, the
   chunk decay, ``A_qk`` and ``A_kk`` from one set of GEMMs (level 3's sub-chunk reference points,
   safe for any gate), the solve on ``A_kk`` in shared memory (level 4's block substitution,
   its diagonal blocks one thread per column), ``W`` and ``U``.
   ``A_kk`` never leaves the SM. Without the delta rule (``delta=False``) it is level 3's
   per-channel stage.
2. ``kernels.gated_state_pass.gated_state_output_pass``: sequential over chunks, the output fused.

Mirrors ``kda.reference.level5``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import math
from typing import NamedTuple

import tilelang.language as T
import torch

from kda import launch
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.kernels.halvings import halvings, upper_half_end
from kda.kernels.merge_by_halves import merge_by_halves
from kda.kernels.norms import NORM_SLICE, normalize_rows, row_square_sums, scale_rows
from kda.kernels.stages import (ACCUM, DIAGONAL_SPAN_MAX, LOG2_E, decay_factor, invert_diagonal_blocks_by_columns,
                                load_beta_checked, log2_cumsum_by_columns, merge_by_substitution, real, tf32_nearest,
                                wy_tail)
from kda.validate import KEY_NORM_SLACK

SOLVE_BLOCK = 16        # the solve's diagonal blocks (level 4), whatever the scores' sub-chunk
# Rows per score sub-chunk. Where a chunk's gate falls by at most 2^96 over each 32-row half, one
# GEMM about the middle row gives both score matrices (scores_about_middle: chunk_intra 1.44 ms
# instead of 1.55 at the headline, run 43). KDA-style gates (-2 softplus(x)) fall further in 90% of
# the chunks (snippets/level3/diagonal_path.py); those take 16-row sub-chunks, four GEMMs and
# merges, but still GEMMs: 32-row sub-chunks would send them to the pairwise sums, 14 times slower.
SUBCHUNK = 16
WIDE_SUBCHUNK = 32      # half the chunk; None: SUBCHUNK in every chunk
# The delta rule's bound on b ||k||^2, with the host check's slack for rounding (check_keys)
KEY_BOUND = 2.0 * KEY_NORM_SLACK
LN_2 = math.log(2.0)


# --8<-- [start:intra_helpers]
def ref_gate(G_s, s, d, BC):
    """``G_ref`` of sub-chunk ``s``: the cumulative gate at the row before it (0 for ``s = 0``)."""
    return T.if_then_else(s > 0, G_s[T.max(s * BC - 1, 0), d], 0.0)


def falls_too_far(G_s, s, d, BC):
    """Whether the gate of channel ``d`` falls by more than ``DIAGONAL_SPAN_MAX`` (log2) across
    sub-chunk ``s``, from ``G_ref`` to its last row: then its diagonal block needs pairwise sums."""
    return ref_gate(G_s, s, d, BC) - G_s[s * BC + BC - 1, d] > DIAGONAL_SPAN_MAX


def middle_row(x, BC):
    """The last row of the first half of the sub-chunk (``BC`` rows) that holds row ``x``: the reference of its
    diagonal block about the middle (``middles``). ``x`` a Python int or a TIR expression."""
    return (x // BC) * BC + BC // 2 - 1


def halves_fall_too_far(G_s, s, d, BC):
    """Whether the gate of channel ``d`` falls by more than ``DIAGONAL_SPAN_MAX`` over either half of sub-chunk
    ``s`` (from ``G_ref`` to the middle row, or from there to its last row): then even its diagonal block about
    the middle needs pairwise sums."""
    m = middle_row(s * BC, BC)
    return T.max(ref_gate(G_s, s, d, BC) - G_s[m, d], G_s[m, d] - G_s[s * BC + BC - 1, d]) > DIAGONAL_SPAN_MAX


@T.macro
def capped_cumsum_in_place(G_s, C, D, BC):
    """``G_s`` (the cumulative gate, log2) becomes ``G'``: within each ``BC``-row sub-chunk the running sum of its
    steps ``G_t - G_(t-1)`` from its first row, each capped at ``-step_cap(BC)``. One thread per channel, one pass
    down the chunk (the true previous value in a register), so that ``G'_i - G'_m`` (``m = middle_row(i, BC)``) is
    the sum of the capped steps between ``i`` and ``m``: at most ``BC / 2`` of them on either side, within
    ``DIAGONAL_SPAN_MAX`` whatever the gate. Starting each sub-chunk from 0 keeps ``G'`` small (its rounding too)."""
    cap = step_cap(BC)
    for d in T.Parallel(D):
        prev = T.alloc_var(ACCUM)
        acc = T.alloc_var(ACCUM)
        prev = G_s[0, d]
        acc = 0.0
        G_s[0, d] = 0.0
        for i in T.serial(C - 1):
            cur = G_s[i + 1, d]
            acc = T.if_then_else((i + 1) % BC == 0, 0.0, acc + T.max(cur - prev, -cap))
            prev = cur
            G_s[i + 1, d] = acc


def step_cap(BC):
    """The cap on a token's fall (log2) in ``capped_cumsum_in_place``: ``DIAGONAL_SPAN_MAX`` over the ``BC / 2``
    steps of a half sub-chunk (12 for 16 rows). A pair across a capped step has a true decay below ``2^-12`` and a
    capped one at most that, so each score moves by at most ``2^-12 ||x_i|| ||k_j||`` (Cauchy-Schwarz over the
    channels)."""
    return DIAGONAL_SPAN_MAX / (BC // 2)


def subchunk_falls(G, BC):
    """On the host, what ``falls_too_far`` and ``halves_fall_too_far`` hold against ``DIAGONAL_SPAN_MAX``: for the
    chunk-local cumulative gates ``G [..., C, D]`` (log2 units), per sub-chunk of ``BC`` rows the fall from ``G_ref``
    to its last row and the larger fall of its two halves about ``middle_row``, each ``[..., C / BC, D]``."""
    ref = torch.cat([torch.zeros_like(G[..., :1, :]), G[..., BC - 1:-1:BC, :]], dim=-2)
    mid, end = G[..., middle_row(0, BC)::BC, :], G[..., BC - 1::BC, :]
    return ref - end, torch.maximum(ref - mid, mid - end)


@T.macro
def pairwise_diagonal(Left_s, K_s, G_s, Out_s, factor, beta_s, C, D, BC):
    """The 16 x 16 diagonal blocks of the decayed scores summed pair by pair in float32 (a chunk
    whose gate falls too far inside a sub-chunk for one GEMM): ``Out[i, j] = factor * sum_d
    left_id k_jd 2^(G_id - G_jd)``, causal (``j <= i``), or strict and times ``b_i`` with ``beta_s``."""
    acc = T.alloc_fragment([C, BC], ACCUM)
    T.clear(acc)
    for d in T.serial(D):
        for i, jj in T.Parallel(C, BC):
            j = (i // BC) * BC + jj
            acc[i, jj] += (T.Cast(ACCUM, Left_s[i, d]) * T.Cast(ACCUM, K_s[j, d])
                           * decay_factor(G_s[i, d] - G_s[j, d]) * real(j <= i))
    for i, jj in T.Parallel(C, BC):
        j = (i // BC) * BC + jj
        if beta_s is None:
            Out_s[i, j] = acc[i, jj] * factor
        else:
            Out_s[i, j] = T.if_then_else(j < i, acc[i, jj] * beta_s[i], 0.0)


PAIRWISE_SLICES = 4     # channel slices of the walk by products: C x 4 threads, one (row, slice) each


@T.macro
def token_decays(G_s, A_s, C, BC):
    """``A_s[j, d] = 2^(G_jd - G_(j-1)d)``, each token's own decay (``<= 1``; 1 on a sub-chunk's first row,
    which a walk by products never multiplies in): one exponential per element for all the pairs of the
    sub-chunks of ``BC`` rows (the forward's steep chunks here, the backward's pair sums in
    ``kda.kernels.backward_chunks``)."""
    for j, d in T.Parallel(C, A_s.shape[1]):
        A_s[j, d] = T.if_then_else(j % BC > 0, decay_factor(G_s[j, d] - G_s[T.max(j - 1, 0), d]), 1.0)


@T.macro
def pairwise_diagonal_by_products(Left_s, K_s, A_s, Out_s, factor, beta_s, part_s, C, D, BC):
    """``pairwise_diagonal``'s sums with no exponential per pair: a thread per row and slice of channels walks
    the row's sub-chunk from the row down, the pair's decay ``2^(G_i - G_j)`` the running product of the token
    decays ``A_s`` (``token_decays``) between them, every factor ``<= 1`` (exact for any gate, as the pairwise
    form; only the rounding of up to ``BC - 1`` products differs), 16 accumulators per thread in registers;
    then the slices' partial sums ``part_s [C, PAIRWISE_SLICES, BC]`` added up."""
    W = D // PAIRWISE_SLICES
    for i, sl in T.Parallel(C, PAIRWISE_SLICES):
        acc = T.alloc_local([BC], ACCUM)
        for jj in T.unroll(BC):
            acc[jj] = 0.0
        i0 = (i // BC) * BC
        for dd in T.serial(W):
            d = sl * W + dd
            left = T.Cast(ACCUM, Left_s[i, d])
            f = T.alloc_var(ACCUM)
            f = 1.0
            for r in T.unroll(BC):                # j from the sub-chunk's last row to its first
                jj = BC - 1 - r
                j = i0 + jj
                on = j <= i
                acc[jj] = acc[jj] + T.if_then_else(on, left * T.Cast(ACCUM, K_s[j, d]) * f, 0.0)
                f = T.if_then_else(on, f * A_s[j, d], 1.0)
        for jj in T.unroll(BC):
            part_s[i, sl, jj] = acc[jj]
    for i, jj in T.Parallel(C, BC):
        j = (i // BC) * BC + jj
        total = T.alloc_var(ACCUM)
        total = 0.0
        for sl in T.unroll(PAIRWISE_SLICES):
            total = total + part_s[i, sl, jj]
        if beta_s is None:
            Out_s[i, j] = T.if_then_else(j <= i, total * factor, 0.0)
        else:
            Out_s[i, j] = T.if_then_else(j < i, total * beta_s[i], 0.0)
# --8<-- [end:intra_helpers]


# --8<-- [start:chunk_intra]
def chunk_intra(DK, DV=None, chunk_size=64, subchunk=SUBCHUNK, wide_subchunk=WIDE_SUBCHUNK, dtype="bfloat16",
                gate_dtype="float32", threads=256, min_blocks=None, delta=True, varlen=False, value_groups=1,
                scalar_gate=False, backward_outputs=False, qk_l2norm=False, pairwise="exp", gate_act=None,
                beta_act=None, check_keys=False, middles=False, middles_by_rows=False, merge="substitution",
                keep_loaded=False, fast_activations=False, tile_sequences=False, stream=False):
    """Everything a chunk needs before the sequential pass, from one load of ``q, k, g`` (and
    ``v, beta``), every chunk at once. Arguments at run time: ``Q, K [B, T, H, DK]``, ``V [B, T,
    H, DV]``, ``g [B, T, H, DK]``, ``beta [B, T, H]`` (float32), ``scale``, then the outputs
    ``Qw = scale Q 2^G``, ``Kw = K 2^(G_last - G)`` (dtype), ``decay = 2^G_last [B, H, NC, DK]``
    (float32), ``A_qk [B, T, H, C]`` (dtype, masked, scale in), with ``delta`` ``W = T diag(b)
    (K 2^G)``, ``U = T diag(b) V`` (dtype), and last ``flags [2]`` (int32, zeroed by the caller):
    ``flags[0] = 1`` if a gate is not finite and ``<= 0``, ``flags[1] = 1`` if a ``b`` is outside
    ``[0, 1]``, then ``chunks``. Without ``delta`` (level 3's per-channel gate) ``V``, ``beta``, ``W``
    and ``U`` are ``[1, ...]`` stand-ins that the kernel never touches (and ``DV`` is not used). With
    ``varlen`` (packed sequences, ``B = 1``) ``chunks [NC, 2]`` (int32) holds the first token and the
    length of every chunk of every sequence (``chunk_table``); ``decay`` is then ``[1, H, NC, DK]``
    in that order, and rows past a chunk's length are neither read as data nor written (they
    belong to the next sequence). Dense, ``chunks`` is a ``[1, 1]`` stand-in. ``tile_sequences`` (varlen): each
    chunk of the table is a tile of whole short sequences (``kda.packed.sequence_tiles``) and a last argument
    ``starts [T]`` (int32) gives each token's sequence by its first token; ``A_qk`` and ``A_kk`` keep the pairs of one
    sequence only, so that a pass from zero states over the tiles gives each sequence's outputs (its ``W``, ``Qw``
    and ``decay`` then multiply zero states; the tile's gate sums over its sequences, and ``G_i - G_j`` of a pair of
    one sequence is that sequence's alone). Without it ``starts`` is a ``[1]`` stand-in. ``stream`` (with
    ``tile_sequences``): the table's chunks are those of the packed tokens cut as one sequence, whatever the boundaries,
    and the state is reset where a sequence starts (``kda.reference.packed_stream``): ``Qw`` and ``W`` are written
    only on the rows that continue a sequence begun before the chunk (zeros elsewhere: those rows read no state),
    ``Kw`` only on the rows of the chunk's last sequence (the state leaving the chunk is that sequence's), and
    ``decay`` is zero where that sequence began in the chunk (the state is reset), so that the pass over the stream,
    unchanged, gives each sequence's outputs from a zero state.
    ``Q`` and ``K`` may have fewer heads than the rest (grouped value heads, as in fla):
    ``H = value_groups HQ``, value head ``h`` reading query and key head ``h // value_groups``.
    With ``scalar_gate`` (GDN: one gate per head, passed as ``g [B, T, H, 1]``) the scores are one
    GEMM of the raw ``[q; k]`` with ``k``, and the decay ``2^(G_i - G_j)`` multiplies them where they
    are written (``scores_scalar_gate``); no sub-chunks, no factor tables, exact for any gate.

    Every factor is a product of two numbers ``<= 1`` (or, on the diagonal, a bounded ``>= 1``):
    with ``G_ref`` the gate just before a row's sub-chunk (``subchunk`` rows) and ``G_end`` at its
    last row,
    each element needs only ``x = 2^(G - G_ref)`` and ``y = 2^(G_end - G)``; the rest are
    per-sub-chunk tables (``2^G_ref``, ``2^(G_last - G_end)``, ``2^(G_ref_I - G_end_J)``).

    * The left operand stacks ``q x`` over ``k x`` (rows of sub-chunk ``I``), so that both score
      matrices come from one set of GEMMs with one right operand: ``Ke = k y`` (float32).
    * Off the diagonal, query sub-chunk ``I``: keys of the sub-chunks ``J < I`` as
      ``Ke_j 2^(G_ref_I - G_end_J)``; one GEMM per ``I``, kept on the rows of sub-chunk ``I``.
    * On the diagonal: ``Ke_j 2^(G_ref_J - G_end_J)``, one GEMM while the gate falls by at most
      ``DIAGONAL_SPAN_MAX`` inside every sub-chunk (bf16 operands, whose range is float32's;
      float32 operands and tf32 for fp16 inputs), pairwise sums otherwise.
    * ``Qw = scale (q x) 2^G_ref``, ``Kw = Ke 2^(G_last - G_end)``, ``K 2^G = (k x) 2^G_ref``.
    * bf16, where the gate falls by at most ``DIAGONAL_SPAN_MAX`` over each half of the chunk
      (``wide_subchunk`` rows): one reference for the whole chunk, the gate ``G_m`` at the middle
      row, so that ``A = [q; k] 2^(G - G_m) (k 2^(G_m - G))^T`` is one GEMM with no merges
      (``scores_about_middle``).

    ``A_kk`` (float32) stays in shared memory: the solve is level 4's (the diagonal blocks by
    ``invert_diagonal_blocks_by_columns``), then ``W`` and ``U``.

    ``backward_outputs`` (dense, with ``delta``; ``kda.backward``'s ``PAIR_PIECES_FROM_FORWARD``): three more
    outputs after ``chunks``, what the backward's chunk kernels read of the forward's pairs instead of making
    them again: ``G [B, H, NC C, GD]`` (float32, the cumulative gate in log2 units, flat past the end),
    ``Tinv [B, T, H, C]`` (dtype, ``T``; the blocks above the diagonal zero) and ``KKE [B, T, H, C]``
    (float32, ``A_kk`` before the row scaling by ``b``). ``A_kk`` is then made without ``b`` and scaled once
    it is written; without the flag the generated code is the forward's.

    ``qk_l2norm`` (``kda.gated_delta``'s ``L2NORM_IN_KERNEL``; fla's ``use_qk_l2norm_in_kernel``): each row of
    ``q`` and ``k`` is divided by its L2 norm (``sqrt(sum x^2 + 1e-6)``) as the tile is loaded (and loaded again),
    rounded back to the inputs' dtype as a normalized copy of the inputs would be: no pass over the inputs
    before the kernel, no float32 copy.

    ``pairwise``: how a steep chunk's diagonal blocks are summed, ``"exp"`` (``pairwise_diagonal``: an
    exponential and four shared loads per pair and channel), ``"products"`` (``kda.gated_delta``'s
    ``PAIRWISE_BY_PRODUCTS``; ``pairwise_diagonal_by_products``: one exponential per token and channel, the pairs'
    decays as running products, sixteen accumulators per thread) or ``"halvings"`` (``kda.gated_delta``'s
    ``PAIRWISE_BY_HALVINGS``; ``diagonal_by_halvings``: per halving of a sub-chunk one GEMM for the queries and, with
    the delta rule, one for the keys, one exponential per element, a C-row operand of its own) or ``"capped"``
    (bf16; ``CAPPED_STEPS``: one GEMM per score matrix about each sub-chunk's middle row as ``middles_by_rows``, every
    token's fall capped at ``step_cap`` so that no factor exceeds ``2^DIAGONAL_SPAN_MAX``: ``capped_cumsum_in_place``
    turns the gate into its capped form first, and ``W`` reads the gate again where the reload had it).

    ``middles`` (bf16; ``DIAGONAL_ABOUT_MIDDLES``): a chunk too steep for the diagonal about each sub-chunk's
    ``G_ref`` but whose gate falls by at most ``DIAGONAL_SPAN_MAX`` over each half of every sub-chunk takes its
    diagonal blocks from one GEMM about each sub-chunk's middle row instead of the pairwise sums
    (``diagonal_by_one_gemm``): twice the fall per sub-chunk on the tensor cores, which covers every gate of
    fla's ``safe_gate`` (at most 5 per token, 57.7 in log2 over half of 16 rows). The pairwise sums keep the
    rest; fp16 keeps them all (its operands cannot hold the factors). ``middles_by_rows`` (``MIDDLES_BY_ROWS``): that
    GEMM as two of ``C`` rows (the queries', then the keys') through the halvings' ``C``-row operand instead of the
    stacked ``2C`` rows, so that no steep variant holds more shared memory than a mild chunk (two blocks per SM).

    ``gate_act`` / ``beta_act`` (``kda.gated_delta``'s ``ACTIVATIONS_IN_KERNEL``; fla's ``use_gate_in_kernel`` and
    ``use_beta_sigmoid_in_kernel``): ``g`` and ``beta`` come raw and are activated as they are loaded, the gate
    to ``-exp(A_log) softplus(g + dt_bias)`` (``"softplus"``) or ``lower_bound sigmoid(exp(A_log) (g + dt_bias))``
    (``"sigmoid"``) in float32 before its cumsum, ``beta`` to ``sigmoid(beta)`` (``"sigmoid"``); three more
    arguments after ``G_kept``: ``A_log [H]``, ``dt_bias [H, GD]`` (float32) and ``lower_bound``. The value
    checks then see the activated gate (``flags[0]``: not finite) and a raw ``beta`` that is not finite
    (``flags[1]``).

    ``check_keys`` (with the delta rule and raw keys; ``kda.gated_delta``'s ``KEY_CHECK_IN_KERNEL``): ``flags [3]``,
    ``flags[2] = 1`` where a row's ``b ||k||^2`` exceeds the delta rule's bound 2 by more than rounding
    (``KEY_BOUND``): the sums of squares of the key tile as it is loaded (``row_square_sums``, in registers),
    compared once ``b`` is loaded. No pass over the inputs of its own.

    ``keep_loaded`` (bf16, a gate per channel, not with ``backward_outputs``; ``RELOAD_FROM_KEPT``): a steep chunk,
    whose diagonal needs the cumulative gate and the raw ``q``, ``k`` again after the scores wrote over them, takes
    the gate back from where it parked it (``G_kept [B, H, NC C, GD]``, float32, the argument after ``chunks``, a
    ``[1, 1, 1, 1]`` stand-in without the flag; written for steep chunks only) and, with ``qk_l2norm``, the rows'
    inverse norms from shared memory, instead of loading, activating and summing the gate and summing the squares
    again.

    ``fast_activations`` (with ``gate_act`` or ``beta_act``; ``FAST_ACTIVATIONS``): softplus as ``ln 2 log2(1 +
    2^(x log2 e))`` and the sigmoids as ``1 / (1 + 2^(-x log2 e))``, two and one approximate exponentials and
    logarithms (``ex2``/``lg2``), where ``log1pf(expf(x))`` and ``expf`` are library routines of tens of
    instructions; a softplus below ``2^-24`` becomes 0 (its share of a cumulative gate is under float32's rounding).

    ``merge`` (with the delta rule): how the solve completes the inverse below its diagonal blocks,
    ``"substitution"`` (``kda.kernels.stages.merge_by_substitution``, float32 on the CUDA cores) or ``"halves"``
    (``kda.kernels.merge_by_halves``: the lower-left half by two tf32 GEMMs; ``SOLVE_BY_HALVES``).
    """
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BC = chunk_size, subchunk
    HQ = T.dynamic("HQ")                       # query and key heads: H = value_groups HQ
    NC = T.dynamic("NC") if varlen else T.ceildiv(S, C)
    NS = C // BC
    R = 2 * C if delta else C                  # rows of the stacked left operand
    if min_blocks is None:                     # bf16 fits two blocks per SM (registers capped)
        min_blocks = 2 if dtype == "bfloat16" else 1
    # bf16 diagonal operands share the off-diagonal GEMM's fragment layout (merged in registers);
    # fp16 cannot hold keys times 2^96, so its diagonal is a tf32 GEMM merged through shared memory
    same_layout = dtype == "bfloat16"
    # bf16: chunks whose gates allow it take one GEMM about the middle row; fp16 merges its tf32
    # diagonal by the sub-chunk size, so it keeps one size
    wide = wide_subchunk if same_layout and wide_subchunk else None
    assert wide is None or wide == C // 2, "wide_subchunk is half the chunk (or None)"
    assert delta or not scalar_gate, "a scalar gate without the delta rule is level 3's own kernel"
    assert not backward_outputs or (delta and not varlen), "the backward's outputs: dense, with the delta rule"
    assert not tile_sequences or varlen, "tile_sequences: a table of tiles (varlen)"
    assert not stream or (tile_sequences and delta), "stream: the pairs masked by sequence, the delta rule"
    stream_rows: dict = {}                     # stream: each chunk's row masks for the stores, set in body
    assert pairwise in ("exp", "products", "halvings", "capped"), "pairwise: 'exp', 'products', 'halvings' or 'capped'"
    assert merge in ("substitution", "halves") and (merge == "substitution" or C == 4 * SOLVE_BLOCK)
    GD = 1 if scalar_gate else DK              # gates per row
    # A_kk's row factor b: with backward_outputs it goes on after A_kk is written out (KKE)
    row_b = (lambda beta_s, i: 1.0) if backward_outputs else (lambda beta_s, i: beta_s[i])

    assert gate_act in (None, "softplus", "sigmoid") and beta_act in (None, "sigmoid"), "the activations fla names"
    assert not ((gate_act or beta_act) and backward_outputs), "the backward's call activates in torch"
    activations = gate_act is not None or beta_act is not None
    assert not check_keys or (delta and not qk_l2norm), "check_keys: raw keys, with the delta rule"
    NF = 3 if check_keys else 2                 # the value flags: gate, beta (and keys)
    # fp16's operands cannot hold a factor of 2^96 (its tf32 operands would need another buffer the SM has not)
    assert pairwise != "capped" or (same_layout and not middles and not backward_outputs), \
        "pairwise='capped' needs bf16, without middles or backward_outputs"
    middles = middles and same_layout
    middles_by_rows = middles and middles_by_rows
    # fp16 at level 5, 128 key channels: the halvings' buffers beside the tf32 diagonal's ask 241664 bytes of shared
    # memory, more than an SM grants a block (232448): run 108 could not launch it
    assert not (pairwise == "halvings" and delta and not same_layout and DK > 64), \
        "pairwise='halvings' with the delta rule and DK > 64 needs bf16 (fp16's needs more shared memory than an SM has)"
    # bf16 writes Ke over the gate (the steep reload needs it back); GDN's scalar gate does not reload; the backward's
    # call reloads as before
    keep = keep_loaded and same_layout and not scalar_gate and not backward_outputs
    assert not fast_activations or activations, "fast_activations: with gate_act or beta_act"
    softplus = (lambda x: LN_2 * T.log2(1.0 + T.exp2(x * LOG2_E))) if fast_activations else \
        (lambda x: T.log1p(T.exp(x)))
    sigmoid = (lambda x: 1.0 / (1.0 + T.exp2(-x * LOG2_E))) if fast_activations else T.sigmoid
    # too_steep[0]: a sub-chunk falls too far for the diagonal about G_ref; with middles, too_steep[1]: a half of
    # one falls too far for the diagonal about its middle (the pairwise sums then)
    PAIRWISE = 1 if middles else 0

    # a row's gate referred to its sub-chunk's middle row, for diagonal_about_middles_by_rows (a plain function: a
    # lambda inside a macro has its arguments taken for the macro's loop variables)
    def about_middle(G_s, i, d):
        return G_s[i, d] - G_s[middle_row(i, BC), d]

    @T.macro
    def load_gate(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh):
        """The chunk's gate into ``G_s`` as its cumsum in log2 units (through ``g_s`` where its dtype is not
        float32), activated first with ``gate_act``."""
        T.copy(g[bb, t0:t0 + C, bh, :], g_s)
        if gate_act is None:
            log2_cumsum_by_columns(g_s, G_s, L, C, GD, flags)
        else:
            A = T.exp(A_log[bh])
            for i, d in T.Parallel(C, GD):
                x = T.Cast(ACCUM, g_s[i, d]) + dt_bias[bh, d]
                if gate_act == "softplus":
                    G_s[i, d] = -A * T.if_then_else(x > 20.0, x, softplus(x))
                else:
                    G_s[i, d] = lower_bound * sigmoid(A * x)
            log2_cumsum_by_columns(G_s, G_s, L, C, GD, flags)

    @T.macro
    def gate_again(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh, kept, c):
        """The chunk's cumulative gate back into ``G_s`` once something was written over it (the scores' ``Ke``, the
        capped steps): from where the scores parked it with ``keep_loaded``, else loaded, activated and summed again."""
        if keep:
            for i, d in T.Parallel(C, DK):
                G_s[i, d] = kept[bb, bh, c * C + i, d]
        else:
            load_gate(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh)

    @T.macro
    def load_beta(beta, beta_s, flags, t0, L, bb, bh, key_sums_s=None):
        """The chunk's ``b``: ``load_beta_checked``, or with ``beta_act`` the sigmoid of the raw value (0 on the
        rows past ``L``; ``flags[1]`` set where a raw value is not finite); with ``check_keys``, ``flags[2] = 1``
        where a row's ``b ||k||^2`` (``key_sums_s``: the rows' ``||k||^2``) exceeds ``KEY_BOUND``."""
        if beta_act is None:
            load_beta_checked(beta, beta_s, flags, t0, L, C, bb, bh)
        else:
            for i in T.Parallel(C):
                x = beta[bb, t0 + T.min(i, L - 1), bh]
                beta_s[i] = T.if_then_else(i < L, sigmoid(x), 0.0)
                if i < L:
                    if real(x >= -3.0e38) * real(x <= 3.0e38) == 0.0:       # NaN fails both
                        flags[1] = 1
        if check_keys:
            for i in T.Parallel(C):
                if i < L:
                    if beta_s[i] * key_sums_s[i] > KEY_BOUND:
                        flags[2] = 1

    @T.macro
    def store_rows(src_s, dst, bb, t0, L, bh, row_mask=None):
        """The chunk's rows of ``dst`` from ``src_s``: a TMA store of the whole tile; with
        ``varlen`` only the ``L`` rows of this sequence (the tile's other rows are the next one's).
        ``row_mask [C]`` (varlen): each row times its factor (``stream``'s masks)."""
        if varlen and row_mask is not None:
            for i, d in T.Parallel(C, src_s.shape[1]):
                if i < L:
                    dst[bb, t0 + i, bh, d] = T.Cast(ACCUM, src_s[i, d]) * row_mask[i]
        elif varlen:
            for i, d in T.Parallel(C, src_s.shape[1]):
                if i < L:
                    dst[bb, t0 + i, bh, d] = src_s[i, d]
        else:
            T.copy(src_s, dst[bb, t0:t0 + C, bh, :])

    @T.macro
    def scaled_rows(Qw, Kw, scale, buffers, t0, L, bb, bh, BX):
        """One pass over the chunk: ``x = 2^(G - G_x)`` and ``y = 2^(G_y - G)`` per element, the rest
        from the tables of row ``s``: the left operand ``[q x; k x]``, ``Ke = k y``, ``K 2^G``, then Qw
        and Kw out. ``BX`` rows per sub-chunk (``s = i // BX``, ``G_x`` = ``G_ref`` and ``G_y`` =
        ``G_end`` of ``s``); ``None``: every row about the middle gate in row 0 of ``Gend_s``. G, q and
        k come from registers, so that the pass only writes shared memory (read and written in
        place, tilelang put a block barrier into each of its eight iterations; run 41)."""
        Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep, G_f, q_f, k_f = buffers
        row = lambda i: 0 if BX is None else i // BX              # the table row of row i
        G_x = lambda i, d: Gend_s[0, d] if BX is None else Gend_s[T.max(i // BX - 1, 0), d] * real(i >= BX)
        T.copy(G_s, G_f)
        T.copy(Rgt_s, q_f)
        T.copy(K_s, k_f)
        for i, d in T.Parallel(C, DK):
            G = G_f[i, d]
            x = T.exp2(G - G_x(i, d))
            y = T.exp2(Gend_s[row(i), d] - G)
            qx = T.Cast(ACCUM, q_f[i, d]) * x
            kv = T.Cast(ACCUM, k_f[i, d])
            Rgt_s[i, d] = qx * Pref_s[row(i), d] * scale               # Qw
            Lft_s[i, d] = qx
            if delta:
                Lft_s[C + i, d] = kv * x
                K_s[i, d] = kv * x * Pref_s[row(i), d]                 # K 2^G, for W
            Ke_s[i, d] = kv * y
        store_rows(Rgt_s, Qw, bb, t0, L, bh, stream_rows.get("reads"))
        for i, d in T.Parallel(C, DK):
            Rgt_s[i, d] = Ke_s[i, d] * Pend_s[row(i), d]
        store_rows(Rgt_s, Kw, bb, t0, L, bh, stream_rows.get("last"))

    @T.macro
    def scores(Qw, Kw, scale, buffers, t0, L, bb, bh, BX, kept=None, c=None):
        """Factor tables, Qw and Kw, and both score matrices into ``A`` by sub-chunks of ``BX`` rows
        (``buffers``: the shared and fragment buffers of ``body``, named as there). ``kept`` (``keep_loaded``):
        where a steep chunk ``c`` parks its cumulative gate before ``Ke`` is written over it."""
        Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep, G_f, q_f, k_f = buffers
        NX = C // BX
        for s, d in T.Parallel(NX, DK):
            G_end = G_s[s * BX + BX - 1, d]
            Gend_s[s, d] = G_end
            Pref_s[s, d] = T.exp2(ref_gate(G_s, s, d, BX))
            Pend_s[s, d] = T.exp2(G_s[C - 1, d] - G_end)
            for J in T.serial(s + 1):                    # G_ref_s - G_end_J <= 0 for J < s
                Cross_s[s * (s + 1) // 2 + J, d] = T.exp2(
                    T.min(ref_gate(G_s, s, d, BX) - G_s[J * BX + BX - 1, d], DIAGONAL_SPAN_MAX))
            if falls_too_far(G_s, s, d, BX):
                too_steep[0] = 1
                if middles:
                    if halves_fall_too_far(G_s, s, d, BX):
                        too_steep[1] = 1
        if kept is not None:
            if too_steep[0] == 1:                        # plain stores and loads: the same proxy as the reload's
                for i, d in T.Parallel(C, DK):
                    kept[bb, bh, c * C + i, d] = G_s[i, d]

        scaled_rows(Qw, Kw, scale, buffers, t0, L, bb, bh, BX)

        # off the diagonal: one GEMM per query sub-chunk I, kept on its rows
        T.clear(A)
        for I in T.unroll(1, NX):
            for j, d in T.Parallel(C, DK):
                Rgt_s[j, d] = Ke_s[j, d] * Cross_s[I * (I + 1) // 2 + T.min(j // BX, I), d] * real(j < I * BX)
            T.gemm(Lft_s, Rgt_s, A_part, transpose_B=True, clear_accum=True)
            for r, j in T.Parallel(R, C):
                A[r, j] = A[r, j] + T.if_then_else((r % C) // BX == I, A_part[r, j], 0.0)

        # the diagonal blocks: one GEMM unless the gate falls too far inside a sub-chunk
        if too_steep[0] == 0:
            if same_layout:                              # bf16: merged into A in registers
                for j, d in T.Parallel(C, DK):
                    Rgt_s[j, d] = Ke_s[j, d] * Cross_s[(j // BX) * (j // BX + 3) // 2, d]
                T.gemm(Lft_s, Rgt_s, A_part, transpose_B=True, clear_accum=True)
                for r, j in T.Parallel(R, C):            # causal for A_qk (j <= i), strict for A_kk
                    causal = j < r % C + T.if_then_else(r < C, 1, 0)
                    A[r, j] = T.if_then_else((r % C) // BX == j // BX,
                                             T.if_then_else(causal, A_part[r, j], 0.0), A[r, j])

    @T.macro
    def scores_about_middle(Qw, Kw, scale, buffers, t0, L, bb, bh):
        """Qw, Kw and both score matrices into ``A`` from one GEMM, every row and column referred to
        the gate at the chunk's middle row, ``G_m``: left ``[q; k] 2^(G - G_m)``, right
        ``k 2^(G_m - G)``. For chunks whose gate falls by at most ``DIAGONAL_SPAN_MAX`` over each
        half (the wide sub-chunks' condition), so that no factor exceeds ``2^96``; products above
        the diagonal can overflow and are masked by the caller."""
        Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep, G_f, q_f, k_f = buffers
        for d in T.Parallel(DK):
            G_m = G_s[C // 2 - 1, d]
            Gend_s[0, d] = G_m
            Pref_s[0, d] = T.exp2(G_m)
            Pend_s[0, d] = T.exp2(G_s[C - 1, d] - G_m)
        scaled_rows(Qw, Kw, scale, buffers, t0, L, bb, bh, None)
        for j, d in T.Parallel(C, DK):
            Rgt_s[j, d] = Ke_s[j, d]
        T.gemm(Lft_s, Rgt_s, A, transpose_B=True, clear_accum=True)

    @T.macro
    def scores_scalar_gate(Qw, Kw, scale, Lft_s, K_s, G_s, Rgt_s, A, Aqk_s, A_s, beta_s, t0, L, bb, bh):
        """One gate per head (``Lft_s`` holds q in its first rows): ``A = [q; k] k^T`` from the raw
        inputs in one GEMM, then ``A_qk`` and ``A_kk`` times the decay ``2^(G_i - G_j)`` (``<= 1`` on
        and below the diagonal, masked above); ``Qw``, ``Kw`` and ``K 2^G`` are row scalings by
        ``2^G_i`` and ``2^(G_last - G_i)``."""
        P_s = T.alloc_shared([C], ACCUM)                           # 2^G_i
        E_s = T.alloc_shared([C], ACCUM)                           # 2^(G_last - G_i)
        for i in T.Parallel(C):
            P_s[i] = T.exp2(G_s[i, 0])
            E_s[i] = T.exp2(G_s[C - 1, 0] - G_s[i, 0])
        for i, d in T.Parallel(C, DK):                             # q is in rows 0 .. C - 1 already
            Lft_s[C + i, d] = K_s[i, d]
        T.gemm(Lft_s, K_s, A, transpose_B=True, clear_accum=True)
        for i, d in T.Parallel(C, DK):
            Rgt_s[i, d] = T.Cast(ACCUM, Lft_s[i, d]) * (P_s[i] * scale)             # Qw
        store_rows(Rgt_s, Qw, bb, t0, L, bh, stream_rows.get("reads"))
        for i, d in T.Parallel(C, DK):
            Rgt_s[i, d] = T.Cast(ACCUM, Lft_s[C + i, d]) * E_s[i]                   # Kw
        store_rows(Rgt_s, Kw, bb, t0, L, bh, stream_rows.get("last"))
        for i, d in T.Parallel(C, DK):
            K_s[i, d] = T.Cast(ACCUM, Lft_s[C + i, d]) * P_s[i]                     # K 2^G, for W
        for i, j in T.Parallel(C, C):
            Aqk_s[i, j] = T.if_then_else(j <= i, A[i, j] * scale * decay_factor(G_s[i, 0] - G_s[j, 0]), 0.0)
        for i, j in T.Parallel(C, C):
            A_s[i, j] = T.if_then_else(j < i, A[C + i, j] * row_b(beta_s, i) * decay_factor(G_s[i, 0] - G_s[j, 0]), 0.0)

    @T.macro
    def diagonal_by_halvings(Rgt_s, K_s, G_s, Half_s, A_half, q_f, Aqk_s, A_s, beta_s, scale):
        """A steep chunk's diagonal blocks (``subchunk`` rows) into ``Aqk_s`` and ``A_s`` by halvings, exact for any
        gate: for blocks of ``2h`` rows (``h = subchunk / 2, .., 1``), a pair with ``i`` in a block's lower half and
        ``j`` in its upper half is ``(x_i 2^(G_i - G_b)) . (k_j 2^(G_b - G_j))`` with ``b`` the upper half's last
        row, both factors ``<= 1`` (``kda.kernels.halvings``): per halving one GEMM of ``q 2^(G - G_b)`` and, with
        the delta rule, one of ``k 2^(G - G_b)``, each into ``A_half`` (``C x C``) and its pairs written where they
        belong; then ``A_qk``'s diagonal, ``q_i . k_i``, from a GEMM of the rows as they are. The left operand is
        ``Half_s`` (``C`` rows), not the stacked ``Lft_s`` (``2C``): 16 KB less live beside ``A_s`` and ``Aqk_s``,
        so that a block takes 108 KB and two fit an SM, as for mild chunks. ``Rgt_s`` holds q (reloaded) on
        entry and is the right operand from there, q going to ``q_f``; ``K_s`` (k) and ``G_s`` (the cumulative gate)
        are read, not written."""
        T.copy(Rgt_s, q_f)
        for h in halvings(BC, 1):                                   # a Python tuple: each halving its own code
            b = lambda x: upper_half_end(x, h)
            for i, d in T.Parallel(C, DK):
                lower = i > b(i)
                e = G_s[i, d] - G_s[b(i), d]                        # <= 0 below b, >= 0 up to it
                f = T.exp2(T.if_then_else(lower, e, -e))
                Half_s[i, d] = T.if_then_else(lower, T.Cast(ACCUM, q_f[i, d]) * f, 0.0)
                Rgt_s[i, d] = T.if_then_else(lower, 0.0, T.Cast(ACCUM, K_s[i, d]) * f)
            T.gemm(Half_s, Rgt_s, A_half, transpose_B=True, clear_accum=True)
            # each pair written as a select of the new value and the old one (run 107: a conditional store per
            # destination in one loop had tilelang store both under neither branch)
            for i, j in T.Parallel(C, C):
                pair = i // (2 * h) == j // (2 * h) and i > b(i) and j <= b(j)
                Aqk_s[i, j] = T.if_then_else(pair, A_half[i, j] * scale, Aqk_s[i, j])
            if delta:
                for i, d in T.Parallel(C, DK):
                    lower = i > b(i)
                    f = T.exp2(T.min(G_s[i, d] - G_s[b(i), d], 0.0))
                    Half_s[i, d] = T.if_then_else(lower, T.Cast(ACCUM, K_s[i, d]) * f, 0.0)
                T.gemm(Half_s, Rgt_s, A_half, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    pair = i // (2 * h) == j // (2 * h) and i > b(i) and j <= b(j)
                    A_s[i, j] = T.if_then_else(pair, A_half[i, j] * row_b(beta_s, i), A_s[i, j])
        for i, d in T.Parallel(C, DK):
            Half_s[i, d] = q_f[i, d]
            Rgt_s[i, d] = K_s[i, d]
        T.gemm(Half_s, Rgt_s, A_half, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):
            if i == j:
                Aqk_s[i, j] = A_half[i, j] * scale

    @T.macro
    def diagonal_about_middles_by_rows(Half_s, Right, A_half, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale):
        """``diagonal_by_one_gemm`` about the middles (``middles_by_rows``) with a ``C``-row left operand: ``q 2^e``
        against ``k 2^-e`` into ``A_half`` (``C x C``), ``A_qk``'s blocks written; then, with the delta rule, ``k 2^e``
        against the same right operand, ``A_kk``'s blocks. ``e``: row ``i``'s gate referred to its sub-chunk's middle
        row, ``G_i - G_m`` (``about_middle``; with the steps capped where ``G_s`` holds ``capped_cumsum_in_place``'s
        form).
        ``Rgt_s`` holds q on entry and may be ``Right``."""
        for i, d in T.Parallel(C, DK):
            Half_s[i, d] = Rgt_s[i, d] * T.exp2(about_middle(G_s, i, d))
        for j, d in T.Parallel(C, DK):
            Right[j, d] = K_s[j, d] * T.exp2(T.min(-about_middle(G_s, j, d), DIAGONAL_SPAN_MAX))
        T.gemm(Half_s, Right, A_half, transpose_B=True, clear_accum=True)
        for i, j in T.Parallel(C, C):
            if i // BC == j // BC:
                Aqk_s[i, j] = T.if_then_else(j <= i, A_half[i, j] * scale, 0.0)
        if delta:
            for i, d in T.Parallel(C, DK):
                Half_s[i, d] = K_s[i, d] * T.exp2(about_middle(G_s, i, d))
            T.gemm(Half_s, Right, A_half, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                if i // BC == j // BC:
                    A_s[i, j] = T.if_then_else(j < i, A_half[i, j] * row_b(beta_s, i), 0.0)

    @T.macro
    def diagonal_by_one_gemm(Left, Right, A_diag, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale, about_middles):
        """The diagonal blocks from one GEMM of the stacked ``[q; k] 2^(G - G_x)`` against ``k 2^(G_x - G)``, the pairs
        of each sub-chunk written where they belong (those across sub-chunks are not read). ``G_x`` is the gate at
        each sub-chunk's middle row (``about_middles``, bf16: ``Left``/``Right`` are ``Lft_s``/``Rgt_s``; a chunk
        too steep for ``G_ref`` but not for the middles, every factor within ``2^(+-DIAGONAL_SPAN_MAX)``) or ``G_ref``
        (fp16: float32 operands rounded to tf32, ``G_ref - G`` capped at ``DIAGONAL_SPAN_MAX``). ``Rgt_s`` holds q on
        entry (it may be ``Right``: q is read first); ``K_s`` (k) and ``G_s`` (the cumulative gate) are read."""
        ref = (lambda row, d: G_s[middle_row(row, BC), d]) if about_middles else \
            (lambda row, d: ref_gate(G_s, row // BC, d, BC))
        rounded = (lambda value: value) if about_middles else tf32_nearest
        for i, d in T.Parallel(C, DK):
            x = T.exp2(G_s[i, d] - ref(i, d))
            Left[i, d] = rounded(Rgt_s[i, d] * x)
            if delta:
                Left[C + i, d] = rounded(K_s[i, d] * x)
        for j, d in T.Parallel(C, DK):
            Right[j, d] = rounded(K_s[j, d] * T.exp2(T.min(ref(j, d) - G_s[j, d], DIAGONAL_SPAN_MAX)))
        T.gemm(Left, Right, A_diag, transpose_B=True, clear_accum=True)
        for r, j in T.Parallel(R, C):
            if (r % C) // BC == j // BC:
                if r < C:
                    Aqk_s[r, j] = T.if_then_else(j <= r, A_diag[r, j] * scale, 0.0)
                elif delta:
                    A_s[r - C, j] = T.if_then_else(j < r - C, A_diag[r, j] * row_b(beta_s, r - C), 0.0)

    @T.macro
    def body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, t0, L, bb, bh, G_out, Tinv_out, KKE_out,
             A_log=None, dt_bias=None, lower_bound=None, G_kept=None, starts=None):
        """Chunk ``c`` (its index in ``decay``): ``L`` rows from token ``t0`` of sequence ``bb``, value
        head ``bh``, which reads query and key head ``bh // value_groups`` (grouped value heads).
        ``G_out, Tinv_out, KKE_out``: the backward's outputs, ``None`` without ``backward_outputs``; ``A_log,
        dt_bias, lower_bound``: the activations' arguments, ``None`` without them; ``G_kept``: where ``keep_loaded``
        parks a steep chunk's gate."""
        hq = bh // value_groups if value_groups > 1 else bh
        if min_blocks > 1:
            T.annotate_min_blocks_per_sm(min_blocks)
        Lft_s = T.alloc_shared([R, DK], dtype)          # q (rows 0..C-1), later the left operand
        K_s = T.alloc_shared([C, DK], dtype)            # k, later K 2^G (for W)
        G_s = T.alloc_shared([C, GD], ACCUM)            # the cumulative gate, log2
        Rgt_s = T.alloc_shared([C, DK], dtype)          # the right operand, per sub-chunk
        Aqk_s = T.alloc_shared([C, C], dtype)
        A = T.alloc_fragment([R, C], ACCUM)
        g_s = G_s if gate_dtype == ACCUM else T.alloc_shared([C, GD], gate_dtype)

        # q: straight into the left operand for a scalar gate (its GEMM takes the raw inputs)
        T.copy(Q[bb, t0:t0 + C, hq, :], Lft_s[0:C, :] if scalar_gate else Rgt_s)
        T.copy(K[bb, t0:t0 + C, hq, :], K_s)
        key_sums_s = None
        if check_keys:                                  # each key row's ||k||^2, before K_s is rewritten
            keys_f = T.alloc_fragment([C, NORM_SLICE], ACCUM)
            key_sums = T.alloc_fragment([C], ACCUM)
            key_sums_s = T.alloc_shared([C], ACCUM)
            row_square_sums(K_s, keys_f, key_sums, C, DK)
            T.copy(key_sums, key_sums_s)
        if qk_l2norm:
            norm_f = T.alloc_fragment([C, NORM_SLICE], ACCUM)          # kda.kernels.norms' scratch
            sum_f = T.alloc_fragment([C], ACCUM)
            inv_s = T.alloc_shared([C], ACCUM)
            # keep: each tile's inverse norms of its own, for the steep reload
            inv_k_s = T.alloc_shared([C], ACCUM) if keep else inv_s
            normalize_rows(Lft_s if scalar_gate else Rgt_s, norm_f, sum_f, inv_s, C, DK)   # q: Lft_s's first C rows
            normalize_rows(K_s, norm_f, sum_f, inv_k_s, C, DK)
        load_gate(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh)
        if backward_outputs:                            # before bf16's scores write Ke over G_s
            T.copy(G_s, G_out[bb, bh, t0:t0 + C, :])

        if stream:                                      # the rows that read the state, the last sequence's rows
            reads_s = T.alloc_shared([C], ACCUM)
            last_s = T.alloc_shared([C], ACCUM)
            for i in T.Parallel(C):
                seq_first = starts[t0 + T.min(i, L - 1)]
                reads_s[i] = real(seq_first < t0)
                last_s[i] = real(seq_first == starts[t0 + L - 1])
            stream_rows.update(reads=reads_s, last=last_s)
        for d in T.Parallel(DK):
            if stream:                                  # reset where the last sequence began in the chunk
                decay[bb, bh, c, d] = T.exp2(G_s[C - 1, d if GD > 1 else 0]) * real(starts[t0 + L - 1] < t0)
            else:
                decay[bb, bh, c, d] = T.exp2(G_s[C - 1, d if GD > 1 else 0])
        beta_s, A_s = None, None
        if delta:
            beta_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)                 # A_kk times b, float32
        if scalar_gate:
            load_beta(beta, beta_s, flags, t0, L, bb, bh, key_sums_s)
            scores_scalar_gate(Qw, Kw, scale, Lft_s, K_s, G_s, Rgt_s, A, Aqk_s, A_s, beta_s, t0, L, bb, bh)
        else:
            # Ke = k 2^(G_end - G), float32; in place of G for bf16 (fp16 needs G again for tf32)
            Ke_s = G_s if same_layout else T.alloc_shared([C, DK], ACCUM)
            # per sub-chunk s and channel: G_end (G_ref of s is G_end of s - 1, 0 for s = 0)
            Gend_s = T.alloc_shared([NS, DK], ACCUM)
            Pref_s = T.alloc_shared([NS, DK], ACCUM)        # 2^G_ref
            Pend_s = T.alloc_shared([NS, DK], ACCUM)        # 2^(G_last - G_end)
            # 2^(G_ref_I - G_end_J) for J < I, and 2^min(G_ref_I - G_end_I, span max) at J = I
            Cross_s = T.alloc_shared([NS * (NS + 1) // 2, DK], ACCUM)
            A_part = T.alloc_fragment([R, C], ACCUM)
            too_steep = T.alloc_shared([PAIRWISE + 1], "int32")
            too_steep[0] = 0
            if middles:
                too_steep[1] = 0
            if backward_outputs:                       # the pairwise diagonal's row factor, without b
                ones_s = T.alloc_shared([C], ACCUM)
                T.fill(ones_s, 1.0)
            G_f = T.alloc_fragment([C, DK], ACCUM)         # G, q, k in registers for the scores pass
            q_f = T.alloc_fragment([C, DK], dtype)
            k_f = T.alloc_fragment([C, DK], dtype)
            buffers = (Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep, G_f, q_f, k_f)
            kept = G_kept if keep else None
            if wide is None:
                scores(Qw, Kw, scale, buffers, t0, L, bb, bh, BC, kept, c)
            else:
                # one GEMM about the middle while each half falls by at most DIAGONAL_SPAN_MAX, else BC
                wide_ok = T.alloc_shared([1], "int32")
                wide_ok[0] = 1
                for s, d in T.Parallel(C // wide, DK):
                    if falls_too_far(G_s, s, d, wide):
                        wide_ok[0] = 0
                if wide_ok[0] == 1:
                    scores_about_middle(Qw, Kw, scale, buffers, t0, L, bb, bh)
                else:
                    scores(Qw, Kw, scale, buffers, t0, L, bb, bh, BC, kept, c)

            # A_qk scaled and causal, A_kk strictly lower and times b (float32, shared)
            for i, j in T.Parallel(C, C):
                Aqk_s[i, j] = T.if_then_else(j <= i, A[i, j] * scale, 0.0)
            if delta:
                load_beta(beta, beta_s, flags, t0, L, bb, bh, key_sums_s)
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = T.if_then_else(j < i, A[C + i, j] * row_b(beta_s, i), 0.0)

            # the diagonal from the original q and k, reloaded (rare for bf16: steep gates only)
            if too_steep[0] == 1 or not same_layout:
                T.copy(Q[bb, t0:t0 + C, hq, :], Rgt_s)
                T.copy(K[bb, t0:t0 + C, hq, :], K_s)
                if qk_l2norm and keep:                       # the factors of the first load
                    scale_rows(Rgt_s, inv_s, C, DK)
                    scale_rows(K_s, inv_k_s, C, DK)
                elif qk_l2norm:
                    normalize_rows(Rgt_s, norm_f, sum_f, inv_s, C, DK)
                    normalize_rows(K_s, norm_f, sum_f, inv_s, C, DK)
                if same_layout:                              # G_s holds Ke
                    gate_again(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh, kept, c)
            if not same_layout:
                if too_steep[0] == 0:                        # fp16: tf32 operands, merged in shared
                    A_diag = T.alloc_fragment([R, C], ACCUM)
                    Lft32_s = T.alloc_shared([R, DK], ACCUM)
                    Rgt32_s = T.alloc_shared([C, DK], ACCUM)
                    diagonal_by_one_gemm(Lft32_s, Rgt32_s, A_diag, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale, False)
            if middles:
                if too_steep[0] == 1 and too_steep[1] == 0:
                    if middles_by_rows:                      # a C-row operand and C x C accumulator of its own
                        Mid_s = T.alloc_shared([C, DK], dtype)
                        A_mid = T.alloc_fragment([C, C], ACCUM)
                        diagonal_about_middles_by_rows(Mid_s, Rgt_s, A_mid, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale)
                    else:
                        diagonal_by_one_gemm(Lft_s, Rgt_s, A_part, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale, True)
            if pairwise == "capped":
                if too_steep[0] == 1:                        # one GEMM per score matrix, the steps capped
                    Mid_s = T.alloc_shared([C, DK], dtype)
                    A_mid = T.alloc_fragment([C, C], ACCUM)
                    capped_cumsum_in_place(G_s, C, DK, BC)
                    diagonal_about_middles_by_rows(Mid_s, Rgt_s, A_mid, G_s, K_s, Rgt_s, Aqk_s, A_s, beta_s, scale)
                    if delta:                                # W needs the true gate
                        gate_again(g, g_s, G_s, flags, A_log, dt_bias, lower_bound, L, t0, bb, bh, kept, c)
            elif too_steep[PAIRWISE] == 1 and pairwise == "halvings":
                Half_s = T.alloc_shared([C, DK], dtype)
                A_half = T.alloc_fragment([C, C], ACCUM)
                diagonal_by_halvings(Rgt_s, K_s, G_s, Half_s, A_half, q_f, Aqk_s, A_s, beta_s, scale)
            elif too_steep[PAIRWISE] == 1 and pairwise == "products":
                decays_s = T.alloc_shared([C, DK], ACCUM)
                part_s = T.alloc_shared([C, PAIRWISE_SLICES, BC], ACCUM)
                token_decays(G_s, decays_s, C, BC)
                pairwise_diagonal_by_products(Rgt_s, K_s, decays_s, Aqk_s, scale, None, part_s, C, DK, BC)
                if delta:
                    pairwise_diagonal_by_products(K_s, K_s, decays_s, A_s, 1.0, ones_s if backward_outputs else beta_s,
                                                  part_s, C, DK, BC)
            elif too_steep[PAIRWISE] == 1:
                pairwise_diagonal(Rgt_s, K_s, G_s, Aqk_s, scale, None, C, DK, BC)
                if delta:
                    pairwise_diagonal(K_s, K_s, G_s, A_s, 1.0, ones_s if backward_outputs else beta_s, C, DK, BC)
            if delta:
                if too_steep[0] == 1 or not same_layout:     # the keys become K 2^G again
                    for i, d in T.Parallel(C, DK):
                        K_s[i, d] = K_s[i, d] * T.exp2(G_s[i, d])
        if tile_sequences:                                  # pairs of one sequence only, whatever the gate made
            seq_s = T.alloc_shared([C], "int32")
            for i in T.Parallel(C):
                seq_s[i] = starts[t0 + T.min(i, L - 1)]
            for i, j in T.Parallel(C, C):
                if seq_s[i] != seq_s[j]:
                    Aqk_s[i, j] = T.Cast(dtype, 0.0)
                    if delta:
                        A_s[i, j] = 0.0
        store_rows(Aqk_s, A_qk, bb, t0, L, bh)

        if delta:
            V_s = T.alloc_shared([C, DV], dtype)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            T.copy(V[bb, t0:t0 + C, bh, :], V_s)
            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            if backward_outputs:                         # A_kk out without b, then b on its rows
                for i, j in T.Parallel(C, C):
                    if i < L:
                        KKE_out[bb, t0 + i, bh, j] = A_s[i, j]
                    A_s[i, j] = A_s[i, j] * beta_s[i]
            invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)
            if merge == "halves":
                merge_by_halves(A_s, Tinv_s, C, SOLVE_BLOCK)
            else:
                merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)
            if backward_outputs:                         # the blocks above the diagonal were not written
                for i, j in T.Parallel(C, C):
                    if i < L:
                        Tinv_out[bb, t0 + i, bh, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK,
                                                                     Tinv_s[i, j], 0.0)
            wy_tail(Tinv_s, beta_s, K_s, V_s, C, SOLVE_BLOCK)   # W into K_s, U into V_s
            store_rows(K_s, W, bb, t0, L, bh, stream_rows.get("reads"))
            store_rows(V_s, U, bb, t0, L, bh)

    used = lambda shape, flag: shape if flag else [1] * len(shape)     # a [1, ...] stand-in where a flag is off

    if backward_outputs:
        @T.prim_func
        def with_backward_outputs(
            Q: T.Tensor([B, S, HQ, DK], dtype),
            K: T.Tensor([B, S, HQ, DK], dtype),
            V: T.Tensor([B, S, H, DV], dtype),
            g: T.Tensor([B, S, H, GD], gate_dtype),
            beta: T.Tensor([B, S, H], ACCUM),
            scale: T.float32,
            Qw: T.Tensor([B, S, H, DK], dtype),
            Kw: T.Tensor([B, S, H, DK], dtype),
            decay: T.Tensor([B, H, NC, DK], ACCUM),
            A_qk: T.Tensor([B, S, H, C], dtype),
            W: T.Tensor([B, S, H, DK], dtype),
            U: T.Tensor([B, S, H, DV], dtype),
            flags: T.Tensor([NF], "int32"),
            chunks: T.Tensor([1, 1], "int32"),
            G_out: T.Tensor([B, H, NC * C, GD], ACCUM),
            Tinv_out: T.Tensor([B, S, H, C], dtype),
            KKE_out: T.Tensor([B, S, H, C], ACCUM),
        ):
            with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
                body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, c * C, T.min(C, S - c * C), bb, bh,
                     G_out, Tinv_out, KKE_out)

        return with_backward_outputs

    if activations:
        BA = 1 if varlen else B

        @T.prim_func
        def with_activations(
            Q: T.Tensor([BA, S, HQ, DK], dtype),
            K: T.Tensor([BA, S, HQ, DK], dtype),
            V: T.Tensor([BA, S, H, DV], dtype),
            g: T.Tensor([BA, S, H, GD], gate_dtype),
            beta: T.Tensor([BA, S, H], ACCUM),
            scale: T.float32,
            Qw: T.Tensor([BA, S, H, DK], dtype),
            Kw: T.Tensor([BA, S, H, DK], dtype),
            decay: T.Tensor([BA, H, NC, DK], ACCUM),
            A_qk: T.Tensor([BA, S, H, C], dtype),
            W: T.Tensor([BA, S, H, DK], dtype),
            U: T.Tensor([BA, S, H, DV], dtype),
            flags: T.Tensor([NF], "int32"),
            chunks: T.Tensor([NC, 2] if varlen else [1, 1], "int32"),
            G_kept: T.Tensor(used([BA, H, NC * C, GD], keep), ACCUM),
            A_log: T.Tensor([H], ACCUM),
            dt_bias: T.Tensor([H, GD], ACCUM),
            lower_bound: T.float32,
            starts: T.Tensor(used([S], tile_sequences), "int32"),
        ):
            with T.Kernel(NC, H, BA, threads=threads) as (c, bh, bb):
                if varlen:
                    body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, chunks[c, 0], chunks[c, 1], bb,
                         bh, None, None, None, A_log, dt_bias, lower_bound, G_kept, starts)
                else:
                    body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, c * C, T.min(C, S - c * C), bb,
                         bh, None, None, None, A_log, dt_bias, lower_bound, G_kept)

        return with_activations

    # dense: chunk c of sequence bb starts at token c C; varlen (B = 1): the chunk table says where.
    # One signature for every variant of the forward (the backward's outputs have theirs, above): what a
    # variant does not use is a [1, ...] stand-in, never read or written (the delta rule's V, beta, W, U;
    # the chunk table of varlen).
    BB = 1 if varlen else B

    @T.prim_func
    def main(
        Q: T.Tensor([BB, S, HQ, DK], dtype),
        K: T.Tensor([BB, S, HQ, DK], dtype),
        V: T.Tensor(used([BB, S, H, DV], delta), dtype),
        g: T.Tensor([BB, S, H, GD], gate_dtype),
        beta: T.Tensor(used([BB, S, H], delta), ACCUM),
        scale: T.float32,
        Qw: T.Tensor([BB, S, H, DK], dtype),
        Kw: T.Tensor([BB, S, H, DK], dtype),
        decay: T.Tensor([BB, H, NC, DK], ACCUM),
        A_qk: T.Tensor([BB, S, H, C], dtype),
        W: T.Tensor(used([BB, S, H, DK], delta), dtype),
        U: T.Tensor(used([BB, S, H, DV], delta), dtype),
        flags: T.Tensor([NF], "int32"),
        chunks: T.Tensor(used([NC, 2], varlen), "int32"),
        G_kept: T.Tensor(used([BB, H, NC * C, GD], keep), ACCUM),
        starts: T.Tensor(used([S], tile_sequences), "int32"),
    ):
        with T.Kernel(NC, H, BB, threads=threads) as (c, bh, bb):
            if varlen:
                body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, chunks[c, 0], chunks[c, 1], bb, bh,
                     None, None, None, G_kept=G_kept, starts=starts)
            else:
                body(Q, K, V, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, c, c * C, T.min(C, S - c * C), bb, bh,
                     None, None, None, G_kept=G_kept)

    return main


# Subnormals flushed to zero: every exp2 becomes one ex2.approx.ftz, without the fix-up around each
# that ptxas adds otherwise (2% of chunk_intra at every shape, run 51); a factor below 2^-126
# multiplies nothing that shows in bf16 or fp16.
chunk_intra.compile_flags = ("-ftz=true",)
# --8<-- [end:chunk_intra]


# ---- the launcher: the kernel's arguments and outputs on the device, then the launch ----

# CUDA: chunk_intra's steep chunks (a gate that falls by more than 2^96 inside a 16-row sub-chunk: most chunks of a
# layer's gates, -exp(A_log) softplus(.) with A_log up to log 16) summed by running products of the token decays
# (pairwise="products": one exponential per token and channel, sixteen accumulators per thread) instead of an
# exponential and four shared loads per pair and channel; exact for any gate as before. Issue 41 priced the
# steep path at 10.28 ms against 0.656 for mild gates (level 3's record). Its GPU tests passed (run 103), and it
# stays off: at (1, 8192, 96, 128) steep gates (a layer's) take 6.58 ms with it against 9.77, but mild ones
# (logsigmoid) 1.885 against 1.511, the plain call 25% slower.
PAIRWISE_BY_PRODUCTS = False

# CUDA: chunk_intra's steep chunks with their 16 x 16 diagonal blocks by halvings (pairwise="halvings"): for blocks of
# 8, 4, 2 and 1 rows' halves, the pairs across a block's two halves factor through the upper half's last row, both
# factors <= 1, a GEMM for q and one for k per halving and one for A_qk's diagonal, one exponential per element and
# halving. Exact for any gate, as the pairwise sums. The stacked [q; k] operand (2C rows) it took at first held
# 121 KB of shared memory live with A_qk and A_kk, one block per SM (run 123 saw the layer's call pay for it); with a
# C-row operand it takes 108 KB, as mild chunks, two blocks per SM (run 124: its GPU tests passed; run 125, H100, KDA
# at (1, 8192, 96, 128) on a layer's gates activated beforehand: 2.715 ms against 3.444 with the stacked operand).
# Takes the place of PAIRWISE_BY_PRODUCTS where both are on.
# Run 107's GPU tests: level 3 (delta=False) passed, level 5 failed (fp16 every steep gate, bf16 uniform to -20):
# the write of each halving's pairs, read in the generated CUDA, stored A_kk's rows from uninitialized registers
# (see diagonal_by_halvings); rewritten after run 107. Run 108 (H100): every bf16 test passed; fp16 at level 5 with
# 128 key channels asks more shared memory than an SM grants a block, so level 5 takes it in bf16 only
# (steep_chunks). Not yet timed: off.
PAIRWISE_BY_HALVINGS = False

# CUDA (bf16): chunks too steep for the diagonal about each 16-row sub-chunk's G_ref whose gate falls by at most 2^96
# over each half of every sub-chunk take their diagonal blocks from one GEMM about each sub-chunk's middle row
# (middles=True), not the pairwise sums: every gate of fla's safe_gate (lower_bound -5: 57.7 in log2 over 8 rows)
# and a layer's milder heads stay on the tensor cores. The steeper rest keep the pairwise sums of the switches above;
# mild chunks run the code of before. Run 108 (H100): its GPU tests passed (bf16, alone and with the halvings).
# Not yet timed: off.
DIAGONAL_ABOUT_MIDDLES = False

# CUDA (bf16): a call whose gates chunk_intra activates itself (ACTIVATIONS_IN_KERNEL: a layer's raw gate with A_log
# and dt_bias) compiled for steep chunks whatever the two switches above say: halvings for the softplus form, halvings
# and the middles for safe_gate's bounded sigmoid form. Every steep variant costs a fifth under mild gates (run 119,
# H100, KDA at (1, 8192, 96, 128): 2.0 ms against 1.67), which a plain call's gates may be; a layer's are steep: 3.46 ms
# by halvings against 9.36 (softplus gates), 2.53 by both against 6.71 (safe_gate's), and the layer's whole call 6.95
# against 10.01. Run 121 (H100): its GPU tests (test_activations_in_chunk_intra's "steep for activated" cases) passed,
# and the layer's call took 6.93 ms with it against 9.56 without (fla 3.78): on.
STEEP_FOR_ACTIVATED_GATES = True


# CUDA: chunk_intra's solve with the lower-left 32 x 32 half of the inverse by two tf32 GEMMs (merge="halves",
# kda.kernels.merge_by_halves) instead of block substitution on the CUDA cores, whose two shared-memory loads per
# multiply-add cost about 4,100 warp loads per chunk. Compiled here (no more shared memory: tilelang reuses freed
# buffers; 176 bytes spilled against 200). Run 111 (H100): its GPU tests passed (KDA and GDN, bf16 and fp16, dense and
# packed, runs of -20) and chunk_kda takes 1.646 ms against 1.704 at (1, 8192, 96, 128), 2.211 against 2.262 at
# (1, 32768, 32, 128), 2.073 against 2.136 at (4, 4096, 64, 128): on.
SOLVE_BY_HALVES = True


# CUDA (bf16): the middles' diagonal (DIAGONAL_ABOUT_MIDDLES, and safe_gate's form under STEEP_FOR_ACTIVATED_GATES) as
# two GEMMs of C rows through the halvings' operand (middles_by_rows): the stacked operand held 121 KB of shared memory,
# one block per SM, where the rest take 108 KB and two (run 123's reading). Compiles here; its GPU tests (the middles
# cases of test_chunk_intra_steep_chunk_variants and the sigmoid form's of test_activations_in_chunk_intra) passed in
# run 125 (H100). Run 126 (H100, (1, 8192, 96, 128), safe_gate's layer call with a bf16 raw gate): 3.148 ms against
# 3.126 alone (the bf16 gate's own buffer still held a block per SM), 2.033 with RELOAD_FROM_KEPT and FAST_ACTIVATIONS
# (110592 bytes, two blocks per SM; the stacked operand with them takes 121 KB): on.
MIDDLES_BY_ROWS = True

# CUDA (bf16, a gate per channel): a steep chunk's diagonal takes the cumulative gate back from where its scores parked
# it (keep_loaded: G_kept, float32 [B, H, NC C, DK], written for steep chunks only) and, with the keys' norm in the
# kernel, each row's inverse norm from shared memory, instead of loading, activating and summing the gate and
# normalizing q and k a second time. Run 125 (H100, (1, 8192, 96, 128), a layer's gates): chunk_intra 4.32 ms for the
# layer's call against 2.27 with the same gates activated and the keys normalized beforehand, where both reload. The
# cost: G_kept's memory, as a float32 copy of g. Run 126 (H100): its GPU tests passed (the steep variants at level 3 and
# 5, the op's by halvings, the layer's activated call dense and packed, both forms); KDA at (1, 8192, 96, 128): the
# layer's call (softplus, raw gate float32) 4.019 ms against 4.806, the plain call 1.542 against 1.673 (fewer
# registers spilled: 64 bytes against 184), the same outputs bit for bit where no chunk is steep: on.
RELOAD_FROM_KEPT = True

# CUDA: chunk_intra's activations (ACTIVATIONS_IN_KERNEL) by ex2 and lg2 (fast_activations) instead of the library's
# log1pf and expf, for the dtypes in FAST_ACTIVATIONS_DTYPES. Run 126 (H100): the layer's call with the raw gate in
# bf16 passed its tests (both forms, dense and packed) and took 3.897 ms against 5.754 (with RELOAD_FROM_KEPT; 3.841
# against 4.019 from the float32 raw gate): on for bf16. fp16 with the raw gate in fp16 failed the same tests; run 127
# found the gate's dtype the cause, with the fast formulas or without (prepare_chunks now gives fp16 kernels a float32
# gate), and the fast formulas as exact as the library's in fp16 (o 5.3e-4 both, dense); fp16's packed calls with them
# have not run: fp16 stays without them.
FAST_ACTIVATIONS = True
FAST_ACTIVATIONS_DTYPES = ("bfloat16",)


# CUDA (bf16, a gate per channel): every steep chunk's diagonal blocks from one GEMM per score matrix about each
# 16-row sub-chunk's middle row, as the middles do, with every token's fall capped at 12 in log2 (pairwise="capped"):
# then no factor exceeds 2^96 whatever the gate, and a pair across a capped step, whose true decay is below 2^-12,
# moves by at most 2^-12 ||x_i|| ||k_j||. In place of the halvings' 9 GEMMs and 8 passes: one pass down the chunk
# that turns G_s into the capped steps (capped_cumsum_in_place; W reads the gate again after), 2 GEMMs, 3 passes, in the
# buffers of the middles by rows (115712 bytes for a layer's call, two blocks per SM, as with the halvings). On the
# CPU (snippets/level5/capped_steps.py, float64), the cap moves KDA's output by 1e-4 at most, twenty times less than
# bf16's rounding of the inputs. Run 130 (H100) passed the GPU tests of its first form, which summed each element's
# capped steps outward from the middle (8 loads and branches per element, three times): run 131 timed that form
# slower than the defaults on the layer's calls (softplus 4.76 ms against 3.90 by the halvings, safe_gate 2.85
# against 2.03 by the middles, (1, 8192, 96, 128)): the per-element walk cost 0.8 ms. The pass down the chunk
# replaces it. Run 132 (H100) timed it on the layer's softplus call at (1, 8192, 96, 128): 2.319 ms against 3.837 by
# the halvings (fla 3.455 in run 131), its output 2.95e-3 from the defaults' as the first form's was. Run 133 (H100)
# passed its 20 bf16 GPU tests (levels 3 and 5, the ops, the layer's calls dense and packed) and timed it on three
# shapes: the layer's softplus call 2.314 ms against 3.803 at (1, 8192, 96, 128), 3.153 against 5.753 at
# (1, 32768, 32, 128), 2.963 against 4.743 at (4, 4096, 64, 128); slower by 2 to 3% on the plain call (1.568 against
# 1.523 ms, few chunks steep) and on safe_gate's (2.070 against 2.030, the middles' two GEMMs already). Run 134 (H100)
# passed the layer's tests under that default (decode's, the training step's, torch.compile's) and timed a layer's
# gates activated by the caller: 2.049 ms against 8.547 by the default compile at (1, 8192, 96, 128) (fla 3.236),
# 2.789 against 11.993 at (1, 32768, 32, 128), 2.625 against 11.789 at (4, 4096, 64, 128); 2.5% slower on mild gates.
# On, for the gate forms in CAPPED_STEPS_FOR (None: a gate given activated; "softplus": KDA's layer), not for
# safe_gate's sigmoid, whose bound keeps its chunks within the middles' reach.
CAPPED_STEPS = True
CAPPED_STEPS_FOR = (None, "softplus")


def steep_chunks(dtype: str = "bfloat16", delta: bool = True, gate_act: str | None = None,
                 backward_outputs: bool = False) -> dict:
    """``chunk_intra``'s compile flags for steep chunks (a gate per channel), by the switches above (``gate_act``:
    the form of the gate the kernel activates itself, ``STEEP_FOR_ACTIVATED_GATES``): their diagonal blocks, the
    halvings at level 5 in bf16 only (fp16's do not fit an SM's shared memory: the pairwise sums or products there),
    or with ``CAPPED_STEPS`` (bf16) the capped steps for the gate forms in ``CAPPED_STEPS_FOR`` (not for the
    backward's forward, whose ``backward_outputs`` hand the backward the exact pairs), and with ``RELOAD_FROM_KEPT``
    (bf16) their second load from the parked gate."""
    halvings_fit = dtype == "bfloat16" or not delta
    middles = {"middles": True, **({"middles_by_rows": True} if MIDDLES_BY_ROWS and dtype == "bfloat16" else {})}
    flags = {"keep_loaded": True} if RELOAD_FROM_KEPT and dtype == "bfloat16" else {}
    if CAPPED_STEPS and gate_act in CAPPED_STEPS_FOR and dtype == "bfloat16" and not backward_outputs:  # levels 3, 5
        return {**flags, "pairwise": "capped"}
    if gate_act is not None and STEEP_FOR_ACTIVATED_GATES and halvings_fit:
        return {**flags, "pairwise": "halvings", **(middles if gate_act == "sigmoid" else {})}
    flags.update(middles if DIAGONAL_ABOUT_MIDDLES else {})
    if PAIRWISE_BY_HALVINGS and halvings_fit:
        return {**flags, "pairwise": "halvings"}
    return {**flags, "pairwise": "products"} if PAIRWISE_BY_PRODUCTS else flags


# --8<-- [start:prepare_chunks]
class ChunkForm(NamedTuple):
    """What the sequential pass reads, for every chunk of a batch ``[B, T, H, *]``."""
    Qw: torch.Tensor         # scale Q 2^G                       [B, T, H, DK]
    Kw: torch.Tensor         # K 2^(G_last - G)                  [B, T, H, DK]
    W: torch.Tensor          # T diag(b) (K 2^G)                 [B, T, H, DK]
    U: torch.Tensor          # T diag(b) V                       [B, T, H, DV]
    A_qk: torch.Tensor       # masked decayed scores, scale in   [B, T, H, C]
    decay: torch.Tensor      # 2^G_last of each chunk, float32   [B, H, NC, DK]


def prepare_chunks(q, k, v, g, beta, scale, flags=None, table=None, backward_outputs=False, qk_l2norm=False,
                   activation=None, delta=True, starts=None, stream=False):
    """Stage 1 of the level-5 pipeline (``chunk_intra``), every chunk of the batch at once; without the
    ``delta`` rule level 3's per-channel stage (``v`` and ``beta`` ``None``; ``W`` and ``U`` of the result are
    stand-ins).
    ``flags`` (int32 ``[2]``, zeroed) collects the kernel's value checks of ``g`` and ``beta``, ``[3]`` those of
    the keys too (``check_keys``; ``raise_flagged_inputs``); ``None`` for callers that checked the values
    before. With the ``table`` of packed sequences (``kda.packed.chunk_table``, ``B = 1``) every chunk of every
    sequence is one block of the same launch. ``backward_outputs`` (dense; ``kda.backward``): returns ``(form, G, Tinv,
    KKE)``, the kernel's outputs of that flag (``G [B, H, NC C, GD]`` float32 log2, ``Tinv`` in the inputs'
    dtype, ``KKE`` float32, both ``[B, T, H, C]``). ``qk_l2norm``: the kernel L2-normalizes the rows of ``q`` and
    ``k`` as it loads them (``L2NORM_IN_KERNEL``). ``activation`` (``ACTIVATIONS_IN_KERNEL``): ``g`` and ``beta``
    are raw and the kernel applies that ``kda.activation.Activation`` to them. ``starts`` (with the ``table`` of
    tiles of whole short sequences, ``kda.packed.sequence_tiles``): each token's sequence by its first token,
    pairs of two sequences masked (``tile_sequences``). ``stream`` (with ``starts`` and the table of the packed
    tokens as one sequence, ``packed.stream_table``): the state reset where a sequence starts (``chunk_intra``'s
    ``stream``)."""
    from kda.kernels.build import compile_program

    B, T, HQ, DK = q.shape
    H, C = v.shape[2] if delta else HQ, CHUNK_SIZE       # H: value heads (q, k may have fewer)
    NC = ceildiv(T, C) if table is None else table.chunks.shape[0]
    dtype = launch.dtype_name(q.dtype)
    if dtype == "float16" and g.dtype != torch.float32:
        # fp16 with a gate of 16 bits: that gate's own shared buffer gives tilelang another plan, in which it put a
        # block barrier into a loop whose trip count depends on the thread (run 127: every output not finite); the
        # float32 gate's kernel is the one its tests passed
        g = g.float()
    gate_dtype = str(g.dtype).removeprefix("torch.")
    q, k = q.contiguous(), k.contiguous()
    if delta:
        v, beta = v.contiguous(), beta.to(torch.float32).contiguous()
        rule = dict(DV=v.shape[-1], varlen=table is not None, value_groups=H // HQ, scalar_gate=g.shape[-1] == 1)
    else:                                                # no V, beta, W or U: stand-ins of their ranks
        v, beta = launch.stand_in(4, q.dtype, q.device), launch.stand_in(3, torch.float32, q.device)
        rule = dict(delta=False)
    with torch.cuda.device(q.device):
        extra = {name: True for name, on in (("backward_outputs", backward_outputs), ("qk_l2norm", qk_l2norm)) if on}
        gate_act = activation.gate if activation is not None else None
        extra.update(steep_chunks(dtype, delta, gate_act, backward_outputs) if g.shape[-1] > 1 else {})
        extra.update(launch.keys_checked(flags))
        if delta and SOLVE_BY_HALVES:
            extra["merge"] = "halves"
        if starts is not None:
            extra["tile_sequences"] = True
        if stream:
            extra["stream"] = True
        acts = []                                        # A_log, dt_bias, lower_bound after the chunk table
        if activation is not None:
            extra.update(gate_act=activation.gate, beta_act=activation.beta)
            if FAST_ACTIVATIONS and dtype in FAST_ACTIVATIONS_DTYPES:
                extra["fast_activations"] = True
            GD = g.shape[-1]
            A_log = activation.A_log if activation.A_log is not None else torch.zeros(H, device=q.device)
            dt_bias = activation.dt_bias if activation.dt_bias is not None else torch.zeros(H, GD, device=q.device)
            acts = [A_log.float().contiguous(), dt_bias.float().reshape(H, GD).contiguous(),
                    float(activation.lower_bound)]
        intra = compile_program(chunk_intra, (), DK=DK, chunk_size=C, dtype=dtype, gate_dtype=gate_dtype, **rule,
                                **extra)
        new = lambda shape, dt=q.dtype: launch.new_output(shape, dt, q.device)
        Qw, Kw = new((B, T, H, DK)), new((B, T, H, DK))
        W, U = (new((B, T, H, DK)), new(v.shape)) if delta else (v, v)
        decay, A_qk = new((B, H, NC, DK), torch.float32), new((B, T, H, C))
        if flags is None:
            flags = torch.zeros(2, dtype=torch.int32, device=q.device)
        chunks = table.chunks if table is not None else launch.stand_in(2, torch.int32, q.device)
        if backward_outputs:
            G, KKE = new((B, H, NC * C, g.shape[-1]), torch.float32), new((B, T, H, C), torch.float32)
            Tinv = new((B, T, H, C))
            intra(q, k, v, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, chunks, G, Tinv, KKE)
            return ChunkForm(Qw, Kw, W, U, A_qk, decay), G, Tinv, KKE
        # where steep chunks park their cumulative gate (keep_loaded), else a stand-in
        kept_shape = (1 if table is not None else B, H, NC * C, g.shape[-1])
        kept = new(kept_shape, torch.float32) if extra.get("keep_loaded") else \
            launch.stand_in(4, torch.float32, q.device)
        if starts is None:
            starts = launch.stand_in(1, torch.int32, q.device)
        intra(q, k, v, g, beta, scale, Qw, Kw, decay, A_qk, W, U, flags, chunks, kept, *acts, starts)
    return ChunkForm(Qw, Kw, W, U, A_qk, decay)
# --8<-- [end:prepare_chunks]
