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
    and ``T_22`` over the diagonal halves, ``A_21`` rounded where it is): 14 KB of shared memory less."""
    h = C // 2
    if in_place:                                        # X[q, r, c] at A_s[q block + r, h + c]: never written
        X_s = A_s
        at_x = lambda q, r, c: (q * block + r, h + c)
    else:
        X_s = T.alloc_shared([2, block, block], ACCUM)
        at_x = lambda q, r, c: (q, r, c)
    for q, r, c in T.Parallel(2, block, block):        # the halves: blocks (1, 0) and (3, 2)
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(block):
            acc += A_s[(2 * q + 1) * block + r, 2 * q * block + m] * Tinv_s[2 * q * block + m, 2 * q * block + c]
        X_s[at_x(q, r, c)] = acc
    for q, r, c in T.Parallel(2, block, block):
        acc = T.alloc_var(ACCUM)
        acc = 0.0
        for m in T.serial(block):
            acc += Tinv_s[(2 * q + 1) * block + r, (2 * q + 1) * block + m] * X_s[at_x(q, m, c)]
        Tinv_s[(2 * q + 1) * block + r, 2 * q * block + c] = -acc
    if in_place:
        at_21, at_11, at_22 = (lambda i, j: (h + i, j)), (lambda i, j: (i, j)), (lambda i, j: (h + i, h + j))
        A21_s = T11_s = T22_s = A_s
    else:
        A21_s, T11_s, T22_s = (T.alloc_shared([h, h], ACCUM) for _ in range(3))
        at_21 = at_11 = at_22 = lambda i, j: (i, j)
    Y = T.alloc_fragment([h, h], ACCUM)
    for i, j in T.Parallel(h, h):
        A21_s[at_21(i, j)] = tf32_nearest(A_s[h + i, j])
        T11_s[at_11(i, j)] = tf32_nearest(T.if_then_else(i // block >= j // block, Tinv_s[i, j], 0.0))
        T22_s[at_22(i, j)] = tf32_nearest(T.if_then_else(i // block >= j // block, Tinv_s[h + i, h + j], 0.0))
    if in_place:
        T.gemm(A_s[h:C, 0:h], A_s[0:h, 0:h], Y, clear_accum=True)
    else:
        T.gemm(A21_s, T11_s, Y, clear_accum=True)
    for i, j in T.Parallel(h, h):                       # A_21 T_11, over A_21 (read by now)
        A21_s[at_21(i, j)] = tf32_nearest(Y[i, j])
    if in_place:
        T.gemm(A_s[h:C, h:C], A_s[h:C, 0:h], Y, clear_accum=True)
    else:
        T.gemm(T22_s, A21_s, Y, clear_accum=True)
    for i, j in T.Parallel(h, h):
        Tinv_s[h + i, j] = -Y[i, j]
# --8<-- [end:merge_by_halves]
