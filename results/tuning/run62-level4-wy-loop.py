"""Run 62 (H200): level 4's ``chunk_wy`` with several chunks per block and the next chunk's loads
in flight.

``kda.delta_rule`` takes 1.719 ms at (1, 32768, 32, 128) against fla's ``chunk_delta_rule`` 2.105
(1.22x, the record of 221fa65); the goal (#16) is 1.5x, about 1.40 ms. ``chunk_wy`` is 0.929 ms of
it. Its bytes (k, v in, W, U out: 1.07 GB) take 0.25 ms at 4.3 TB/s, and run 17 found the same
loads and stores alone at 0.30 ms and the kernel without any solve at 0.89: the time is the chain
inside a block (load, ``K K^T``, the solve, two GEMMs, the stores), one chunk per block, nothing
of the next chunk in flight while a chunk computes.

Here a block walks ``chunks_per_block`` chunks of one head in a ``T.Pipelined`` loop, so tilelang's
producer loads chunk ``c + 1`` while chunk ``c`` is solved. W and U go out through their own
shared buffers (``chunk_wy`` writes them into the input buffers, which a pipelined loop hands back
to its producer). The arithmetic is ``chunk_wy``'s, step for step (the same macros of
``kda.kernels.level4`` and ``kda.kernels.stages``), so W and U should be bit-identical. Two
variants also take level 5's solve of the diagonal blocks by columns (run 41: its fifteen barriers
per chunk held 14% of ``chunk_intra``; same sums in the same order).

Compiled here for sm_90a: the pipelined loop with level 4's right-looking solve draws a warning
from tilelang's ThreadSync pass ("Hoisting sync out of an if whose condition is not safe ...
the race remains", condition ``tx % 16 <= r``), which ``chunk_wy`` itself does not: the bitwise
check against ``chunk_wy`` is what tells whether that race is real.

    python results/tuning/run62-level4-wy-loop.py compile     # then each variant in its own process
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, each_in_process, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run62"


def chunk_wy_loop(DK, DV, chunk_size=64, block=16, dtype="bfloat16", threads=128, chunks_per_block=4,
                  num_stages=2, solve="rows"):
    """``chunk_wy`` (substitution merge) with ``chunks_per_block`` chunks per block in a pipelined
    loop. Arguments as ``chunk_wy``'s: ``K, V, beta`` (float32), then ``W, U``. ``solve="columns"``
    inverts the diagonal blocks with level 5's ``invert_diagonal_blocks_by_columns`` (a thread per
    column, no barrier per row; the same sums in the same order) instead of level 4's right-looking
    ``invert_diagonal_blocks`` (a barrier per row)."""
    import tilelang.language as T

    from kda.kernels.level4 import invert_diagonal_blocks
    from kda.kernels.level5 import invert_diagonal_blocks_by_columns
    from kda.kernels.stages import ACCUM, merge_by_substitution, real
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        beta: T.Tensor([B, S, H], ACCUM),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
    ):
        with T.Kernel(T.ceildiv(NC, chunks_per_block), H, B, threads=threads) as (cb, bh, bb):
            K_s = T.alloc_shared([C, DK], dtype)
            V_s = T.alloc_shared([C, DV], dtype)
            beta_s = T.alloc_shared([C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            U_s = T.alloc_shared([C, DV], dtype)
            KK = T.alloc_fragment([C, C], ACCUM)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, DV], ACCUM)
            x_col = T.alloc_local([block], ACCUM)
            c0 = cb * chunks_per_block
            for ci in T.Pipelined(T.min(chunks_per_block, NC - c0), num_stages=num_stages):
                t0 = (c0 + ci) * C
                L = T.min(C, S - t0)
                T.copy(K[bb, t0:t0 + C, bh, :], K_s)
                T.copy(V[bb, t0:t0 + C, bh, :], V_s)
                for i in T.Parallel(C):                            # padding rows: b = 0
                    beta_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
                T.gemm(K_s, K_s, KK, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(C, C):
                    A_s[i, j] = KK[i, j] * beta_s[i] * real(j < i)
                if solve == "columns":
                    invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, block)
                else:
                    invert_diagonal_blocks(A_s, Tinv_s, C, block)
                merge_by_substitution(A_s, Tinv_s, C, block)
                for i, j in T.Parallel(C, C):                      # wy_tail's T diag(b), blocks below
                    Tb_s[i, j] = T.if_then_else(i // block >= j // block, Tinv_s[i, j] * beta_s[j], 0.0)
                T.gemm(Tb_s, K_s, W_f, clear_accum=True)
                T.gemm(Tb_s, V_s, U_f, clear_accum=True)
                T.copy(W_f, W_s)
                T.copy(U_f, U_s)
                T.copy(W_s, W[bb, t0:t0 + C, bh, :])
                T.copy(U_s, U[bb, t0:t0 + C, bh, :])

    return main


VARIANTS = {          # most telling first: a call's time limit may cut the last ones
    "one chunk per block, solve by columns": dict(chunks_per_block=1, num_stages=1, solve="columns"),
    "loop of 8 chunks, 2 stages, solve by columns": dict(chunks_per_block=8, num_stages=2, solve="columns"),
    "loop of 8 chunks, 2 stages": dict(chunks_per_block=8, num_stages=2),
    "loop of 4 chunks, 2 stages": dict(chunks_per_block=4, num_stages=2),
    "loop of 16 chunks, 2 stages": dict(chunks_per_block=16, num_stages=2),
    "loop of 4 chunks, 1 stage": dict(chunks_per_block=4, num_stages=1),
    "loop of 8 chunks, 2 stages, 256 threads": dict(chunks_per_block=8, num_stages=2, threads=256),
}
NAMES = list(VARIANTS)


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name = NAMES[i]
    row = {"what": "compile", "variant": name}
    try:
        kernel = compile_program(chunk_wy_loop, (), target=SM90A, DK=128, DV=128, dtype="bfloat16", **VARIANTS[name])
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-800:]}


def inputs(B, T, H, D, seed):
    import torch

    from kda.bench import random_qkv
    from kda.reference import level4 as ref4
    _, k, v = random_qkv(B, T, H, D, D, seed=seed)
    k = ref4.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    return k, v, beta


def check_and_time(name):
    """W and U of ``name`` bit for bit against ``chunk_wy`` (ragged tails included), then its time
    beside ``chunk_wy``'s and the whole ``kda.delta_rule`` and fla's at the headline shape."""
    import torch

    from kda.bench import median_ms
    from kda.kernels import level4
    from kda.kernels.build import compile_program
    record = compile_program(level4.chunk_wy, (), DK=128, DV=128, dtype="bfloat16")
    kern = None if name == "of record" else compile_program(chunk_wy_loop, (), DK=128, DV=128, dtype="bfloat16",
                                                            **VARIANTS[name])
    for B, T, H in [(2, 1000 + 37, 4), (1, 64 * 9, 3), (1, 64 * 9 + 1, 3), (1, 32768, 32)]:
        k, v, beta = inputs(B, T, H, 128, seed=T)
        W0, U0 = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        record(k, v, beta, W0, U0)
        if kern is None:
            continue
        W, U = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        kern(k, v, beta, W, U)
        torch.cuda.synchronize()
        log(RUN, {"what": "check", "variant": name, "shape": [B, T, H, 128],
                  "nan": bool(W.isnan().any() or U.isnan().any()),
                  "W_equal": bool(torch.equal(W, W0)), "U_equal": bool(torch.equal(U, U0)),
                  "W_max_abs_diff": float((W.float() - W0.float()).abs().max()),
                  "U_max_abs_diff": float((U.float() - U0.float()).abs().max())})
    k, v, beta = inputs(1, 32768, 32, 128, seed=62)
    W, U = torch.empty_like(k), torch.empty_like(v)
    if kern is None:
        from fla.ops.delta_rule import chunk_delta_rule

        from kda.bench import random_qkv
        from kda.delta import delta_rule
        q = random_qkv(1, 32768, 32, 128, 128, seed=63)[0]
        rows = {"chunk_wy": lambda: record(k, v, beta, W, U),
                "kda.delta_rule": lambda: delta_rule(q, k, v, beta),
                "kda.delta_rule, check_values=False": lambda: delta_rule(q, k, v, beta, check_values=False),
                "fla chunk_delta_rule": lambda: chunk_delta_rule(q, k, v, beta, scale=128 ** -0.5)[0]}
    else:
        rows = {"chunk_wy": lambda: kern(k, v, beta, W, U)}
    for label, fn in rows.items():
        log(RUN, {"what": "time", "variant": name, "T": 32768, "stage": label, "ms": median_ms(fn)})


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_in_processes(RUN, len(NAMES), compile_one)
    each_in_process(RUN, ["of record"] + NAMES, check_and_time, limit_s=120)
