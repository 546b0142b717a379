"""The delta rule's WY form per chunk: ``A = tril(diag(b) K K^T, -1)``, ``(I + A)^-1``, ``W`` and ``U``.

``chunk_wy`` runs over all chunks at once: the inverse (``invert_diagonal_blocks_by_columns`` of
``kda.kernels.stages``: the 16 x 16 diagonal blocks by forward substitution, a thread per column;
then ``merge_by_products``, four tf32 GEMMs, or ``merge_by_substitution``, block forward
substitution on the CUDA cores), and ``W = (I + A)^-1 diag(b) K``, ``U = (I + A)^-1 diag(b) V``.
``kda.delta_rule`` runs it, then ``kernels.linear_pass.state_output_pass``. Mirrors
``kda.reference.level4`` (``kernel_mimic`` and its stages).
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch

from kda import launch
from kda.kernels.stages import (ACCUM, invert_diagonal_blocks_by_columns, load_beta_checked, merge_by_substitution,
                                real, tf32_nearest, wy_tail)


# --8<-- [start:merge_by_products]
@T.macro
def merge_by_products(A_s, Tinv_s, C, block):
    """The blocks below the diagonal from four tf32 GEMMs of the whole chunk (4 blocks of 16):
    ``M = D A_off``, ``(I + A)^-1 = (I - M)(I + M^2) D`` (``kda.reference.level4.
    invert_unit_lower_products``). tf32 wgmma reads both operands K-major, so every right
    operand is stored transposed; operands are rounded to the nearest tf32 number."""
    Bt_s = T.alloc_shared([C, C], ACCUM)        # right operands, transposed
    Dt_s = T.alloc_shared([C, C], ACCUM)        # D transposed
    F = T.alloc_fragment([C, C], ACCUM)
    Y = T.alloc_fragment([C, C], ACCUM)
    for i, j in T.Parallel(C, C):
        Bt_s[j, i] = tf32_nearest(A_s[i, j] * real(i // block > j // block))    # A_off^T
        Dt_s[j, i] = tf32_nearest(Tinv_s[i, j])
        Tinv_s[i, j] = tf32_nearest(Tinv_s[i, j])
    T.gemm(Tinv_s, Bt_s, F, transpose_B=True, clear_accum=True)               # M = D A_off
    for i, j in T.Parallel(C, C):
        A_s[i, j] = tf32_nearest(F[i, j])
        Bt_s[j, i] = tf32_nearest(F[i, j])
    T.gemm(A_s, Bt_s, F, transpose_B=True, clear_accum=True)                  # M^2
    for i, j in T.Parallel(C, C):
        Tinv_s[i, j] = tf32_nearest(F[i, j] + real(i == j))
    T.gemm(Tinv_s, Dt_s, Y, transpose_B=True, clear_accum=True)               # Y = (I + M^2) D
    for i, j in T.Parallel(C, C):
        Bt_s[j, i] = tf32_nearest(Y[i, j])
    T.gemm(A_s, Bt_s, F, transpose_B=True, clear_accum=True)                  # M Y
    for i, j in T.Parallel(C, C):
        Tinv_s[i, j] = Y[i, j] - F[i, j]                                        # (I - M) Y
# --8<-- [end:merge_by_products]


# --8<-- [start:chunk_wy]
def chunk_wy(DK, DV, chunk_size=64, block=16, dtype="bfloat16", threads=128, merge="substitution",
             write_inverse=False, chunks_per_block=8, num_stages=2):
    """Arguments at run time: ``K [B, T, H, DK]``, ``V [B, T, H, DV]``, ``beta [B, T, H]``
    (float32), then the outputs ``W [B, T, H, DK]``, ``U [B, T, H, DV]`` (dtype), ``Ainv
    [B, T, H, C]`` (float32, to check the solve alone; a ``[1, 1, 1, 1]`` stand-in without
    ``write_inverse``) and ``flags [2]`` (int32, zeroed by the caller): ``flags[1] = 1`` if a ``b``
    is outside ``[0, 1]`` (``flags[0]``, the gates' flag of levels 3 and 5, stays 0). ``merge``:
    ``"substitution"`` (CUDA cores, float32) or ``"products"`` (tensor cores, tf32; slower on the
    H200, see the level-4 chapter).

    A block walks ``chunks_per_block`` chunks of one head in a pipelined loop, so that the next
    chunk's loads are in flight while a chunk is solved; ``W`` and ``U`` go out through buffers of
    their own, since the loop hands its input buffers back. Run 62 in ``results/tuning``, at
    (1, 32768, 32, 128): 0.760 ms against 0.928 for one chunk per block (4 and 16 chunks per block
    time alike, measured with the right-looking solve)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)
    assert merge == "substitution" or C == 4 * block, "merge='products' is written for 4 blocks"

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        beta: T.Tensor([B, S, H], ACCUM),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        Ainv: T.Tensor([B, S, H, C] if write_inverse else [1, 1, 1, 1], ACCUM),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(T.ceildiv(NC, chunks_per_block), H, B, threads=threads) as (cb, bh, bb):
            K_s = T.alloc_shared([C, DK], dtype)
            V_s = T.alloc_shared([C, DV], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            U_s = T.alloc_shared([C, DV], dtype)
            beta_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            KK = T.alloc_fragment([C, C], ACCUM)
            x_col = T.alloc_local([block], ACCUM)
            c0 = cb * chunks_per_block
            for ci in T.Pipelined(T.min(chunks_per_block, NC - c0), num_stages=num_stages):
                t0 = (c0 + ci) * C
                L = T.min(C, S - t0)
                T.copy(K[bb, t0:t0 + C, bh, :], K_s)
                T.copy(V[bb, t0:t0 + C, bh, :], V_s)
                load_beta_checked(beta, beta_s, flags, t0, L, C, bb, bh)
                T.gemm(K_s, K_s, KK, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = KK[i, j] * beta_s[i] * real(j < i)
                if merge == "products" or write_inverse:    # they read the blocks above the diagonal
                    T.clear(Tinv_s)
                invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, block)
                if merge == "products":
                    merge_by_products(A_s, Tinv_s, C, block)
                else:
                    merge_by_substitution(A_s, Tinv_s, C, block)
                if write_inverse:
                    T.copy(Tinv_s, Ainv[bb, t0:t0 + C, bh, :])
                wy_tail(Tinv_s, beta_s, K_s, V_s, C, block, W_s, U_s)
                T.copy(W_s, W[bb, t0:t0 + C, bh, :])
                T.copy(U_s, U[bb, t0:t0 + C, bh, :])

    return main
# --8<-- [end:chunk_wy]


def run_chunk_wy(k, v, beta, flags):
    """``chunk_wy`` over every chunk of ``k [B, T, H, DK]``, ``v [B, T, H, DV]``, ``beta [B, T, H]``: returns
    ``(W, U)`` in the inputs' dtype (the inverse itself is not written); a ``beta`` outside ``[0, 1]`` sets
    ``flags[1]`` as it is read."""
    from kda.kernels.build import compile_program

    DK, DV = k.shape[-1], v.shape[-1]
    with torch.cuda.device(k.device):
        wy = compile_program(chunk_wy, (), DK=DK, DV=DV, chunk_size=launch.KERNEL_CONFIG["chunk_size"],
                             dtype=launch.dtype_name(k.dtype))
        W, U = launch.new_output(k.shape, k.dtype, k.device), launch.new_output(v.shape, v.dtype, v.device)
        wy(k.contiguous(), v.contiguous(), beta.to(torch.float32).contiguous(), W, U,
           launch.stand_in(4, torch.float32, k.device), flags)
    return W, U
