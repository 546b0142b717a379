"""Run 39 (H200): the level-5 state pass warp-specialised by hand.

The pass of record before this run (``pass_of_record`` below, as it was in ``level5`` at
28ceaa6) is one consumer warpgroup behind tilelang's automatic producer: per chunk four GEMMs,
each waited for, one after another (W S, Qw S, A Vn, Kw^T Vn). Here warpgroup 0 carries only the state's chain (S to shared, W S,
Vn = U - W S, S <- decay S + Kw^T Vn), warpgroup 1 the output (Qw S, then A Vn) beside it, and
one producer warp loads two chunk slots by TMA. Barriers: data ready/free per slot, S and Vn
ready/free between the two warpgroups.
The split pass was adopted as measured: it is ``level5.gated_state_output_pass`` since 9b1f55b.

* check: O and ht of both passes on the same chunk form, outputs poisoned with NaN first,
  at the three benchmark shapes and a ragged one with an initial state;
* time: each pass alone, ``chunk_intra``, and ``chunk_kda`` with each pass.

    python results/tuning/run39-state-pass-ws.py compile check time
"""
import os
import sys

import tilelang.language as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (ROOT, check_state_passes, chunk_form, compile_in_processes, log,  # noqa: E402
                     state_pass_launch, try_compile)

RUN = "run39"
ACCUM = "float32"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]
VARIANTS = {"of record (auto producer)": None, "by hand, 32 columns": 32, "by hand, 64 columns": 64}


def pass_of_record(DK, DV, chunk_size=64, block_dv=32, num_stages=2, threads=128, dtype="bfloat16"):
    """The pass before run 39 (commit 28ceaa6), kept here as the baseline. Arguments at run time: ``Qw, Kw, W [B, T, H, DK]``, ``U [B, T, H, DV]``, ``A_qk [B, T, H, C]``
    (dtype, scale included), ``decay [B, H, NC, DK]`` and ``h0 [B, H, DK, DV]`` (float32), then the
    outputs ``O [B, T, H, DV]`` (dtype) and ``ht`` (float32)."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Qw: T.Tensor([B, S, H, DK], dtype),
        Kw: T.Tensor([B, S, H, DK], dtype),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        A_qk: T.Tensor([B, S, H, C], dtype),
        decay: T.Tensor([B, H, NC, DK], ACCUM),
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, block_dv), H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * block_dv
            Qw_s = T.alloc_shared([C, DK], dtype)
            Kw_s = T.alloc_shared([C, DK], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            A_s = T.alloc_shared([C, C], dtype)
            U_s = T.alloc_shared([C, block_dv], dtype)
            decay_s = T.alloc_shared([DK], ACCUM)
            S_s = T.alloc_shared([DK, block_dv], dtype)
            Vn_s = T.alloc_shared([C, block_dv], dtype)
            O_s = T.alloc_shared([C, block_dv], dtype)
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            WS = T.alloc_fragment([C, block_dv], ACCUM)
            acc_o = T.alloc_fragment([C, block_dv], ACCUM)
            T.copy(h0[bb, bh, :, dv0:dv0 + block_dv], S_f)
            for c in T.Pipelined(T.ceildiv(S, C), num_stages=num_stages):
                T.copy(Qw[bb, c * C:(c + 1) * C, bh, :], Qw_s)
                T.copy(Kw[bb, c * C:(c + 1) * C, bh, :], Kw_s)
                T.copy(W[bb, c * C:(c + 1) * C, bh, :], W_s)
                T.copy(A_qk[bb, c * C:(c + 1) * C, bh, :], A_s)
                T.copy(U[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv], U_s)
                T.copy(decay[bb, bh, c, :], decay_s)
                T.copy(S_f, S_s)
                # every GEMM waits: each reads a different pipelined buffer, and tilelang
                # 0.1.15 hands a buffer back to the producer once its last GEMM is issued
                T.gemm(W_s, S_s, WS, clear_accum=True)
                T.gemm(Qw_s, S_s, acc_o, clear_accum=True)
                for i, j in T.Parallel(C, block_dv):
                    Vn_s[i, j] = U_s[i, j] - WS[i, j]
                T.gemm(A_s, Vn_s, acc_o)
                for i, j in T.Parallel(DK, block_dv):
                    S_f[i, j] = S_f[i, j] * decay_s[i]
                T.gemm(Kw_s, Vn_s, S_f, transpose_A=True)
                T.copy(acc_o, O_s)
                T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + block_dv])
            T.copy(S_f, ht[bb, bh, :, dv0:dv0 + block_dv])

    return main


def factory(name):
    from kda.kernels import level5
    bv = VARIANTS[name]
    if bv is None:
        return pass_of_record, {}
    return level5.gated_state_output_pass, dict(block_dv=bv)    # adopted as measured (9b1f55b)


def compile_one(i):
    sys.path.insert(0, ROOT)
    if i == len(VARIANTS):                      # the intra kernel chunk_kda runs first
        from kda.kernels import level5
        return {"compile": "chunk_intra", **try_compile(lambda: level5.chunk_intra, dict(
            DK=128, DV=128, chunk_size=64, dtype="bfloat16", gate_dtype="float32"))}
    name = list(VARIANTS)[i]
    fn, extra = factory(name)
    return {"compile": name, **try_compile(lambda: fn, dict(DK=128, DV=128, dtype="bfloat16", **extra))}


def check():
    check_state_passes(RUN, factory, list(VARIANTS), SHAPES)


def time_all():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms
    from kda.kernels import level5
    adopted = level5.gated_state_output_pass
    for B, T, H, D in SHAPES:
        form, (q, k, v, g, beta) = chunk_form(B, T, H, D)
        h0 = torch.zeros(B, H, D, D, device="cuda")
        for name in VARIANTS:
            *_, go = state_pass_launch(*factory(name), form, h0)
            log(RUN, {"what": "state pass", "variant": name, "shape": [B, T, H, D], "ms": median_ms(go)})
        for name in VARIANTS:
            fn, extra = factory(name)
            # each variant at its own width, whatever run_state_pass would choose (state_pass_columns)
            level5.gated_state_output_pass = lambda block_dv=None, **p: fn(**p, **extra)
            for check_values in (True, False):
                log(RUN, {"what": "chunk_kda", "variant": name, "check_values": check_values, "shape": [B, T, H, D],
                          "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=check_values))})
            level5.gated_state_output_pass = adopted
        del form, q, k, v, g, beta
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS) + 1, compile_one)
    if "check" in sys.argv:
        check()
    if "time" in sys.argv:
        time_all()
