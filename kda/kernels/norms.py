"""The norms of rows. The L2 norm (fla's ``l2norm``, ``use_qk_l2norm_in_kernel``): ``normalize_rows``, the stage that
divides each row of a shared tile by ``sqrt(sum x^2 + 1e-6)`` (level 5's ``chunk_intra`` runs it on its ``q`` and
``k`` tiles as it loads them), and ``l2_normalize_rows``, that stage as a kernel of its own over ``X [N, D]``, read
once and written once in the inputs' dtype.

The kernel is for the paths whose own kernels do not normalize as they load (GDN's scalar-gate path, whose pass
reads the raw ``q`` and ``k``): torch makes the same result through float32 copies, several passes over
``[B, T, H, D]``. And a KDA layer's gated RMS norm of its output (``gated_rms_norm_rows``), for the same reason.
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch

from kda import launch
from kda.kernels.stages import ACCUM

EPS = 1e-6
NORM_SLICE = 32         # columns squared per register reduction (chunk_intra's registers are capped)


# --8<-- [start:l2_norm]
@T.macro
def row_square_sums(X_s, norm_f, sum_f, C, D):
    """``sum_f [C]`` (float32) = the sum of squares of each of the first ``C`` rows of ``X_s [*, D]``, by register
    reductions over slices of columns (``norm_f [C, NORM_SLICE]``: scratch)."""
    T.clear(sum_f)
    for part in T.unroll(D // NORM_SLICE):
        for i, d in T.Parallel(C, NORM_SLICE):
            x = T.Cast(ACCUM, X_s[i, part * NORM_SLICE + d])
            norm_f[i, d] = x * x
        T.reduce_sum(norm_f, sum_f, dim=1, clear=False)


@T.macro
def normalize_rows(X_s, norm_f, sum_f, inv_s, C, D):
    """Each of the first ``C`` rows of ``X_s [*, D]`` divided by its L2 norm, in place (``norm_f [C,
    NORM_SLICE]``, ``sum_f [C]`` float32 and ``inv_s [C]``: scratch): the squares summed by register
    reductions over slices of columns (``row_square_sums``), then one scaling pass."""
    row_square_sums(X_s, norm_f, sum_f, C, D)
    for i in T.Parallel(C):
        inv_s[i] = T.rsqrt(sum_f[i] + EPS)
    scale_rows(X_s, inv_s, C, D)


@T.macro
def scale_rows(X_s, inv_s, C, D):
    """Each of the first ``C`` rows of ``X_s [*, D]`` times its factor ``inv_s[i]``, in place: ``normalize_rows``'
    last pass, and alone for a tile loaded again whose factors were kept (the same rounding, the same values)."""
    for i, d in T.Parallel(C, D):
        X_s[i, d] = T.Cast(ACCUM, X_s[i, d]) * inv_s[i]


def l2_normalize_rows(D, dtype="bfloat16", block_rows=64, threads=128):
    """Arguments at run time: ``X [N, D]`` (dtype), then the output ``Y [N, D]`` (dtype). One block per
    ``block_rows`` rows: the tile loaded, ``normalize_rows``, the tile stored; rows past ``N`` are neither read as
    data nor written."""
    N = T.dynamic("N")
    R = block_rows

    @T.prim_func
    def main(X: T.Tensor([N, D], dtype), Y: T.Tensor([N, D], dtype)):
        with T.Kernel(T.ceildiv(N, R), threads=threads) as rb:
            x_s = T.alloc_shared([R, D], dtype)
            norm_f = T.alloc_fragment([R, NORM_SLICE], ACCUM)
            sum_f = T.alloc_fragment([R], ACCUM)
            inv_s = T.alloc_shared([R], ACCUM)
            T.copy(X[rb * R:(rb + 1) * R, :], x_s)
            normalize_rows(x_s, norm_f, sum_f, inv_s, R, D)
            T.copy(x_s, Y[rb * R:(rb + 1) * R, :])

    return main
# --8<-- [end:l2_norm]


# --8<-- [start:gated_rms_norm]
def gated_rms_norm_rows(D, dtype="bfloat16", block_rows=64, threads=128):
    """A KDA layer's output norm (fla's ``FusedRMSNormGated`` with sigmoid): arguments at run time ``O [N, D]``,
    ``Gt [N, D]`` (dtype: the output and its gate's projection), ``weight [D]`` (float32), ``eps``, then the output
    ``Y [N, D]`` (dtype) ``= O / sqrt(mean(O^2) + eps) * weight * sigmoid(Gt)`` row by row, in float32 and rounded
    once. One block per ``block_rows`` rows; rows past ``N`` are neither read as data nor written."""
    N = T.dynamic("N")
    R = block_rows

    @T.prim_func
    def main(O: T.Tensor([N, D], dtype), Gt: T.Tensor([N, D], dtype), weight: T.Tensor([D], ACCUM),
             eps: T.float32, Y: T.Tensor([N, D], dtype)):
        with T.Kernel(T.ceildiv(N, R), threads=threads) as rb:
            o_s = T.alloc_shared([R, D], dtype)
            g_s = T.alloc_shared([R, D], dtype)
            norm_f = T.alloc_fragment([R, NORM_SLICE], ACCUM)
            sum_f = T.alloc_fragment([R], ACCUM)
            inv_s = T.alloc_shared([R], ACCUM)
            T.copy(O[rb * R:(rb + 1) * R, :], o_s)
            T.copy(Gt[rb * R:(rb + 1) * R, :], g_s)
            row_square_sums(o_s, norm_f, sum_f, R, D)
            for i in T.Parallel(R):
                inv_s[i] = T.rsqrt(sum_f[i] / D + eps)
            for i, d in T.Parallel(R, D):
                o_s[i, d] = T.Cast(ACCUM, o_s[i, d]) * inv_s[i] * weight[d] / (1.0 + T.exp(-T.Cast(ACCUM, g_s[i, d])))
            T.copy(o_s, Y[rb * R:(rb + 1) * R, :])

    return main
# --8<-- [end:gated_rms_norm]


# ---- the launcher ----

def normalized_rows(x):
    """``x``'s rows (its last dimension) divided by their L2 norm by ``l2_normalize_rows``, in ``x``'s dtype."""
    from kda.kernels.build import compile_program

    D = x.shape[-1]
    with torch.cuda.device(x.device):
        kernel = compile_program(l2_normalize_rows, (), D=D, dtype=launch.dtype_name(x.dtype))
        out = launch.new_output(x.shape, x.dtype, x.device)
        kernel(x.contiguous().view(-1, D), out.view(-1, D))
    return out


def gated_rms_normalized(o, gate, weight, eps):
    """``o [..., D]`` divided by its rows' root mean square (``eps`` inside), times ``weight [D]`` and
    ``sigmoid(gate)`` (``o``'s shape), by ``gated_rms_norm_rows``, in ``o``'s dtype."""
    from kda.kernels.build import compile_program

    D = o.shape[-1]
    with torch.cuda.device(o.device):
        kernel = compile_program(gated_rms_norm_rows, (), D=D, dtype=launch.dtype_name(o.dtype))
        out = launch.new_output(o.shape, o.dtype, o.device)
        kernel(o.contiguous().view(-1, D), gate.to(o.dtype).contiguous().view(-1, D), weight.float().contiguous(),
               float(eps), out.view(-1, D))
    return out
