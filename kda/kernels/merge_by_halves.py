"""The inverse of a chunk's ``I + A`` (``A`` strictly lower, ``C = 4 x 16`` rows) below its diagonal blocks, with its
largest third on the tensor cores: GDN's ``chunk_gated_inverse`` and KDA's ``chunk_intra`` with ``merge="halves"``
(``kda.kernels.stages.merge_by_substitution`` is the default)."""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.stages import ACCUM, tf32_nearest


# --8<-- [start:merge_by_halves]
@T.macro
def merge_by_halves(A_s, Tinv_s, C, block, in_place=False):
    """The blocks below the diagonal of ``(I + A_s)^-1`` from its four diagonal blocks (``C = 4 block``):
    the two ``32 x 32`` halves by block substitution on the CUDA cores (``T_21 = -T_22 A_21 T_11`` of
    ``16 x 16`` blocks), then the lower-left half by two tf32 GEMMs, ``-T_22 (A_21 T_11)`` of ``32 x 32``
    blocks (operands rounded to the nearest tf32 number). ``merge_by_substitution`` walks the distances
    1, 2, 3 with a shared-memory load per multiply-add; the GEMMs take the largest third off the CUDA
    cores (FlashQLA's ``kkt_solve`` merges its halves the same way). Blocks above the diagonal were never
    written, so they are selected away, not multiplied by 0 (uninitialised shared memory may hold NaN).
    ``in_place``: the scratch in ``A_s``'s quadrants, which are spent by then (``X`` above the diagonal, ``T_11``
    and ``T_22`` over the diagonal halves, ``A_21`` rounded into ``X``'s quadrant once the halves are merged): 14 KB
    of shared memory less. Not rounded where it is: a loop that reads and writes the same shared addresses gets a
    block barrier in every step from tilelang (0.1.15), eight a chunk here."""
    h = C // 2
    # the scratch as (buffer, first row, first column): buffers of its own, or A_s's spent quadrants: X, then A_21,
    # above the diagonal (never written)
    if in_place:
        X, A21, T11, T22 = (A_s, 0, h), (A_s, 0, h), (A_s, 0, 0), (A_s, h, h)
    else:
        X_s = T.alloc_shared([2 * block, block], ACCUM)
        A21_s = T.alloc_shared([h, h], ACCUM)
        T11_s = T.alloc_shared([h, h], ACCUM)
        T22_s = T.alloc_shared([h, h], ACCUM)
        X, A21, T11, T22 = (X_s, 0, 0), (A21_s, 0, 0), (T11_s, 0, 0), (T22_s, 0, 0)
    tile = lambda at: at[0][at[1]:at[1] + h, at[2]:at[2] + h]          # a GEMM operand
    for q, r, c in T.Parallel(2, block, block):        # the halves: blocks (1, 0) and (3, 2)
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(block):
            acc += A_s[(2 * q + 1) * block + r, 2 * q * block + m] * Tinv_s[2 * q * block + m, 2 * q * block + c]
        X[0][X[1] + q * block + r, X[2] + c] = acc
    for q, r, c in T.Parallel(2, block, block):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(block):
            acc += Tinv_s[(2 * q + 1) * block + r, (2 * q + 1) * block + m] * X[0][X[1] + q * block + m, X[2] + c]
        Tinv_s[(2 * q + 1) * block + r, 2 * q * block + c] = -acc
    Y = T.alloc_fragment([h, h], ACCUM)
    for i, j in T.Parallel(h, h):
        A21[0][A21[1] + i, A21[2] + j] = tf32_nearest(A_s[h + i, j])
        T11[0][T11[1] + i, T11[2] + j] = tf32_nearest(T.if_then_else(i // block >= j // block, Tinv_s[i, j], 0.0))
        T22[0][T22[1] + i, T22[2] + j] = tf32_nearest(
            T.if_then_else(i // block >= j // block, Tinv_s[h + i, h + j], 0.0))
    T.gemm(tile(A21), tile(T11), Y, clear_accum=True)
    for i, j in T.Parallel(h, h):                       # A_21 T_11, over A_21 (read by now)
        A21[0][A21[1] + i, A21[2] + j] = tf32_nearest(Y[i, j])
    T.gemm(tile(T22), tile(A21), Y, clear_accum=True)
    for i, j in T.Parallel(h, h):
        Tinv_s[h + i, j] = -Y[i, j]
# --8<-- [end:merge_by_halves]
