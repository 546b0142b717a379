"""The L2 norm of rows (fla's ``l2norm``, ``use_qk_l2norm_in_kernel``) as one TileLang kernel: each row of
``X [N, D]`` divided by ``sqrt(sum x^2 + 1e-6)``, read once and written once in the inputs' dtype.

For the paths whose own kernels do not normalize as they load (GDN's scalar-gate path, whose pass reads the raw
``q`` and ``k``): torch makes the same result through float32 copies, several passes over ``[B, T, H, D]``.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T

from kda.kernels.stages import ACCUM

EPS = 1e-6


# --8<-- [start:l2_normalize_rows]
def l2_normalize_rows(D, dtype="bfloat16", block_rows=64, threads=128):
    """Arguments at run time: ``X [N, D]`` (dtype), then the output ``Y [N, D]`` (dtype). One block per
    ``block_rows`` rows: the tile loaded, the squares summed per row by a register reduction, the rows scaled
    and stored; rows past ``N`` are neither read as data nor written."""
    N = T.dynamic("N")
    R = block_rows

    @T.prim_func
    def main(X: T.Tensor([N, D], dtype), Y: T.Tensor([N, D], dtype)):
        with T.Kernel(T.ceildiv(N, R), threads=threads) as rb:
            x_s = T.alloc_shared([R, D], dtype)
            sq_f = T.alloc_fragment([R, D], ACCUM)
            sum_f = T.alloc_fragment([R], ACCUM)
            T.copy(X[rb * R:(rb + 1) * R, :], x_s)
            for i, d in T.Parallel(R, D):
                sq_f[i, d] = T.Cast(ACCUM, x_s[i, d]) * T.Cast(ACCUM, x_s[i, d])
            T.reduce_sum(sq_f, sum_f, dim=1)
            for i, d in T.Parallel(R, D):
                x_s[i, d] = T.Cast(ACCUM, x_s[i, d]) * T.rsqrt(sum_f[i] + EPS)
            T.copy(x_s, Y[rb * R:(rb + 1) * R, :])

    return main
# --8<-- [end:l2_normalize_rows]
