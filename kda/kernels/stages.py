"""Pieces the kernels of several levels share: the accumulator type, the masks and clamped
decays of the gated levels (3 and 5), tf32 rounding, and the block forward substitution that
completes the inverse of ``I + A`` and the WY tail after it (levels 4 and 5). One definition each; the level modules
import them.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import math

import tilelang.language as T

ACCUM = "float32"
LOG2_E = 1.0 / math.log(2.0)


# --8<-- [start:helpers]
def real(condition):
    """1.0 where ``condition`` holds, else 0.0, as a select: a mask multiplied in keeps the
    loop free of branches (a branch per element costs the latency of its loads and exp2)."""
    return T.if_then_else(condition, 1.0, 0.0)


def decay_factor(log2_decay):
    """``2^x`` clamped to ``x <= 0``: where the caller masks an element out, ``x`` may be
    positive, and ``2^x`` could overflow to ``inf`` (and ``inf * 0`` is NaN)."""
    return T.exp2(T.min(log2_decay, 0.0))


# Largest gate span (log2 units) inside one diagonal sub-chunk for the GEMM path: the key
# factor 2^span and the query factor 2^-span must stay normal fp32 numbers next to bf16
# inputs (|x| in about [2^-10, 2^3]): 96 leaves 20 binades of room on either side.
DIAGONAL_SPAN_MAX = 96.0


def tf32_nearest(x):
    """``x`` rounded to the nearest tf32 number (11 significant bits; Veltkamp's split).
    The tensor cores would drop the low 13 bits instead, a bias that adds up in the sums."""
    c = T.call_extern(ACCUM, "__fmul_rn", x, T.float32(8193.0))   # 2^13 + 1, rounded: must not
    return c - (c - x)                                              # be fused into an FMA
# --8<-- [end:helpers]


# --8<-- [start:log2_cumsum]
FLOAT32_MAX = 3.4028234663852886e38


@T.macro
def log2_cumsum_by_columns(g_s, G_s, L, C, D, flags):
    """``G_s = cumsum(g_s) / ln 2`` down the chunk, one thread per channel (the rows of a column
    are a running sum in a register; rows past the real length ``L`` count as 0). In place when
    ``g_s`` is ``G_s``. A gate that is not finite and ``<= 0`` sets ``flags[0]``, so that the
    caller can raise after the launch instead of reading every gate once more before it. Level 3's
    ``chunk_cumsum`` (``D = 1``: one thread) and level 5's ``chunk_intra`` (``D = DK``)."""
    for d in T.Parallel(D):
        acc = T.alloc_var(ACCUM)
        bad = T.alloc_var(ACCUM)
        acc = 0.0
        bad = 0.0
        for i in T.serial(C):
            x = T.Cast(ACCUM, g_s[i, d])
            ok = real(x <= 0.0) * real(x >= -FLOAT32_MAX)                      # NaN fails both
            bad = T.max(bad, T.if_then_else(i < L, 1.0 - ok, 0.0))
            acc += T.if_then_else(i < L, x * LOG2_E, 0.0)
            G_s[i, d] = acc
        if bad > 0.0:
            flags[0] = 1
# --8<-- [end:log2_cumsum]


def row_token(t0, i, L, rows_s=None):
    """The token that row ``i`` of a chunk of ``L`` real rows reads: ``t0 + i`` (the last real row past ``L``), or
    ``rows_s[i]`` where the chunk's rows are gathered from a row map (``kda.packed.sequence_rows``, whose rows
    past the length repeat the last token already). A plain function, not a macro: it returns an expression."""
    return t0 + T.min(i, L - 1) if rows_s is None else rows_s[i]


@T.macro
def load_beta_checked(beta, beta_s, flags, t0, L, C, bb, bh, rows_s=None):
    """``beta_s`` = the chunk's ``b`` from ``beta [B, T, H]`` (0 on the padding rows past ``L``);
    ``flags[1] = 1`` if one is outside ``[0, 1]``, so that the caller can raise the full check's
    error after one read-back (levels 4 and 5). ``rows_s``: the token of each row, where the rows are
    gathered (``row_token``)."""
    for i in T.Parallel(C):
        b = T.Cast(ACCUM, beta[bb, row_token(t0, i, L, rows_s), bh])      # float32, or half read as it is
        beta_s[i] = T.if_then_else(i < L, b, 0.0)
        if i < L:
            if real(b >= 0.0) * real(b <= 1.0) == 0.0:       # NaN fails both
                flags[1] = 1


# --8<-- [start:state_shape]
def state_shape(present, N, H, DK, DV):
    """The shape of a sequential pass's initial or final state argument: ``[N, H, DK, DV]``, or,
    where the kernel is compiled without it, a ``[1, 1, 1, 1]`` stand-in that it never reads or
    writes. Every pass keeps one signature, ``(inputs..., h0, O, ht)``, whatever its flags."""
    return [N, H, DK, DV] if present else [1, 1, 1, 1]


@T.macro
def load_state(h0, S_f, n, bh, dv0, present):
    """The state's value columns ``dv0 ..`` of sequence ``n``, head ``bh`` into the fragment
    ``S_f``: from ``h0`` if ``present``, else zeros (``h0`` is then a stand-in and is not read)."""
    if present:
        T.copy(h0[n, bh, :, dv0:dv0 + S_f.shape[1]], S_f)
    else:
        T.clear(S_f)


@T.macro
def store_state(S_f, ht, n, bh, dv0, present):
    """``S_f`` out to ``ht`` if ``present`` (else ``ht`` is a stand-in and nothing is written)."""
    if present:
        T.copy(S_f, ht[n, bh, :, dv0:dv0 + S_f.shape[1]])
# --8<-- [end:state_shape]


# --8<-- [start:invert_diagonal_blocks]
@T.macro
def invert_diagonal_blocks_by_columns(A_s, Tinv_s, x, C, block):
    """The diagonal blocks of ``(I + A_s)^-1`` (``A_s [C, C]`` strictly lower, float32, shared) by
    forward substitution, one thread per column of a ``block x block`` block, the column in the
    registers ``x``: ``x_i = [i = c] - sum_{m < i} A_im x_m``. The same sums in the same order as
    the right-looking loop it replaced (bit-identical), without that loop's block barrier per row:
    in level 5's ``chunk_intra`` those fifteen barriers held 14% of the time (run 41). The blocks
    above the diagonal are not written. Levels 4 (``chunk_wy``) and 5 (``chunk_intra``)."""
    for t in T.Parallel(C):
        for i in T.unroll(block):
            x[i] = real(i == t % block)
            for m in T.unroll(i):
                x[i] = x[i] - A_s[(t // block) * block + i, (t // block) * block + m] * x[m]
        for i in T.unroll(block):
            Tinv_s[(t // block) * block + i, t] = x[i]
# --8<-- [end:invert_diagonal_blocks]


# --8<-- [start:merge_by_substitution]
@T.macro
def merge_by_substitution(A_s, Tinv_s, C, block):
    """The blocks below the diagonal by block forward substitution on the CUDA cores, in
    float32: by distance ``d = I - J``, ``X = sum_K A_IK T_KJ``, then ``T_IJ = -T_II X``."""
    n = C // block
    X_s = T.alloc_shared([n - 1, block, block], ACCUM)
    for d in T.unroll(1, n):
        for p, r, c in T.Parallel(n - d, block, block):   # block (I, J) = (p + d, p)
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block * d):
                acc += A_s[(p + d) * block + r, p * block + m] * Tinv_s[p * block + m, p * block + c]
            X_s[p, r, c] = acc
        for p, r, c in T.Parallel(n - d, block, block):
            acc = T.alloc_var(ACCUM)
            acc = 0.0
            for m in T.serial(block):
                acc += Tinv_s[(p + d) * block + r, (p + d) * block + m] * X_s[p, m, c]
            Tinv_s[(p + d) * block + r, p * block + c] = -acc
# --8<-- [end:merge_by_substitution]


# --8<-- [start:wy_tail]
@T.macro
def wy_tail(Tinv_s, beta_s, K_s, V_s, C, block, W_s=None, U_s=None):
    """The WY form's last step (levels 4 and 5): ``W = T diag(b) K`` into ``W_s`` and
    ``U = T diag(b) V`` into ``U_s`` (by default in place of ``K_s`` and ``V_s``; a pipelined loop
    must not write its input buffers), ``T = (I + A)^-1`` in ``Tinv_s`` (float32). Blocks above the
    diagonal are read as zero (the inverse by columns leaves them unwritten). The products go back
    through shared memory, so that the caller stores whole rows."""
    Tb_s = T.alloc_shared([C, C], K_s.dtype)            # T diag(b), cast for the tensor cores
    W_f = T.alloc_fragment([C, K_s.shape[1]], ACCUM)
    U_f = T.alloc_fragment([C, V_s.shape[1]], ACCUM)
    for i, j in T.Parallel(C, C):
        Tb_s[i, j] = T.if_then_else(i // block >= j // block, Tinv_s[i, j] * beta_s[j], 0.0)
    T.gemm(Tb_s, K_s, W_f, clear_accum=True)
    T.gemm(Tb_s, V_s, U_f, clear_accum=True)
    T.copy(W_f, K_s if W_s is None else W_s)
    T.copy(U_f, V_s if U_s is None else U_s)
# --8<-- [end:wy_tail]
