"""The sequential pass of linear attention with a gate per key channel (``kda.gated_attention``
with ``g [B, T, H, DK]``).

It runs after ``kernels.chunk_intra.chunk_intra(delta=False)``, which forms over all chunks at once
the cumsum, the weighted queries and keys, the per-chunk state decay and the intra-chunk scores
``A`` (safe for any ``g <= 0``); ``seq_in_loop_per_channel`` then walks the chunks like level 1 with
three GEMMs. Mirrors ``kda.reference.level3`` (``prepare`` and ``kernel_mimic``).
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import tilelang.language as T
import torch

from kda import launch
from kda.kernels.stages import ACCUM, load_state, state_shape, store_state


# --8<-- [start:seq_in_loop_per_channel]
def seq_in_loop_per_channel(DK, DV, chunk_size=64, block_dv=32, num_stages=3, threads=128,
                            dtype="bfloat16", initial_state=False, final_state=False):
    """Per-channel gate, the sequential pass over the outputs of ``chunk_intra(delta=False)``.
    Arguments at run time: ``Qw, Kw, A, decay, V, h0``, then ``O, ht`` (the state flags as in level 1).

    Per chunk: ``O = Qw S + A V``, then ``S = diag(decay) S + Kw^T V``. The scale is
    already in ``Qw`` and ``A``. Each GEMM is waited for: the three read different
    pipelined buffers, and tilelang 0.1.15 releases a buffer to the producer once its
    last GEMM is issued (see ``kda.kernels.chapters.linear_attention``), so none may be left in flight.
    """
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NV = T.ceildiv(DV, block_dv)
    NC = T.ceildiv(S, C)

    @T.macro
    def chunk_loop(Qw, Kw, A, decay, V, O, S_f, bb, bh, dv0):
        Qw_s = T.alloc_shared([C, DK], dtype)
        Kw_s = T.alloc_shared([C, DK], dtype)
        A_s = T.alloc_shared([C, C], dtype)
        V_s = T.alloc_shared([C, block_dv], dtype)
        decay_s = T.alloc_shared([DK], ACCUM)
        S_s = T.alloc_shared([DK, block_dv], dtype)
        O_s = T.alloc_shared([C, block_dv], dtype)
        acc_o = T.alloc_fragment([C, block_dv], ACCUM)

        for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
            T.copy(Qw[bb, c * C:(c + 1) * C, bh, :], Qw_s)
            T.copy(Kw[bb, c * C:(c + 1) * C, bh, :], Kw_s)
            T.copy(A[bb, c * C:(c + 1) * C, bh, :], A_s)
            T.copy(V[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], V_s)
            T.copy(decay[bb, bh, c, :], decay_s)
            T.copy(S_f, S_s)                               # the state before this chunk
            T.gemm(Qw_s, S_s, acc_o, clear_accum=True)
            T.gemm(A_s, V_s, acc_o)
            for i, j in T.Parallel(DK, block_dv):
                S_f[i, j] = S_f[i, j] * decay_s[i]
            T.gemm(Kw_s, V_s, S_f, transpose_A=True)
            T.copy(acc_o, O_s)
            T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])

    @T.prim_func
    def main(
        Qw: T.Tensor([B, S, H, DK], dtype),
        Kw: T.Tensor([B, S, H, DK], dtype),
        A: T.Tensor([B, S, H, C], dtype),
        decay: T.Tensor([B, H, NC, DK], ACCUM),
        V: T.Tensor([B, S, H, DV], dtype),
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(NV, H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            load_state(h0, S_f, bb, bh, dv0, initial_state)
            chunk_loop(Qw, Kw, A, decay, V, O, S_f, bb, bh, dv0)
            store_state(S_f, ht, bb, bh, dv0, final_state)

    return main
# --8<-- [end:seq_in_loop_per_channel]


def pass_launch(form, v, h0, output_final_state):
    """``seq_in_loop_per_channel`` up to its launch, as ``(launch, o, final state or None)``, on ``form``
    (``kernels.chunk_intra.prepare_chunks(..., delta=False)``: ``Qw, Kw, A_qk, decay``) and ``v [B, T, H, DV]``."""
    from kda.kernels.build import compile_program

    B, T, H, DK = form.Qw.shape
    DV = v.shape[-1]
    device = v.device
    config = launch.KERNEL_CONFIG
    with torch.cuda.device(device):
        kernel = compile_program(seq_in_loop_per_channel, (), DK=DK, DV=DV, dtype=launch.dtype_name(v.dtype),
                                 chunk_size=config["chunk_size"], block_dv=config["block_dv"],
                                 initial_state=h0 is not None, final_state=output_final_state,
                                 num_stages=config["num_stages"], threads=config["threads"])
    return launch.pass_held(kernel, (form.Qw, form.Kw, form.A_qk, form.decay, v.contiguous()), h0, output_final_state,
                            (B, H, DK, DV), (B, T, H, DV), v.dtype, device)
