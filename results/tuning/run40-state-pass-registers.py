"""Run 40 (H200, planned): the level-5 state pass with the state kept in registers as a GEMM operand.

In the pass of record (``level5.gated_state_output_pass``, run 39) the state's chain goes through
shared memory twice per chunk: S is written there for ``W S``, V_new for ``S += Kw^T V_new``.
Here warpgroup 0 keeps the state transposed, ``S^T [BV, DK]``, and both GEMMs of its chain take
their left operand from registers (wgmma's RS form, M = BV = 64): ``(W S)^T = S^T W^T`` and
``S^T <- diag-decayed S^T + V_new^T Kw``. S^T and V_new^T still go to shared memory, for the
output warpgroup, but the chain does not wait for those copies. 64 value columns per block, so
at (1, 32768, 32) it has half the SMs (run 39: 64 columns 0.78 ms there against 0.61 for 32); it
is meant for the shapes where run 39 chose 64 columns.

* check: O and ht against the pass of record (64 columns) on the same chunk form, outputs
  poisoned with NaN, the three benchmark shapes and a ragged one with an initial state;
* time: the passes alone, and ``chunk_kda`` with each.

    python results/tuning/run40-state-pass-registers.py compile check time
"""
import os
import sys

import tilelang.language as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (ROOT, check_state_passes, chunk_form, compile_in_processes, log,  # noqa: E402
                     state_pass_launch, try_compile)

RUN = "run40"
ACCUM = "float32"
SHAPES = [(1, 8192, 96, 128), (4, 4096, 64, 128), (1, 32768, 32, 128)]
VARIANTS = ["of record, 64 columns", "of record, 32 columns", "state in registers, 64 columns"]


def state_pass_in_registers(DK, DV, chunk_size=64, dtype="bfloat16"):
    """Arguments as ``level5.gated_state_output_pass``; 64 value columns per block."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, 64
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
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=384) as (bv, bh, bb):
            dv0 = bv * BV
            Qw_s = T.alloc_shared([2, C, DK], dtype)
            Kw_s = T.alloc_shared([2, C, DK], dtype)
            W_s = T.alloc_shared([2, C, DK], dtype)
            A_s = T.alloc_shared([2, C, C], dtype)
            U_s = T.alloc_shared([2, C, BV], dtype)
            decay_s = T.alloc_shared([2, DK], ACCUM)
            St_s = T.alloc_shared([BV, DK], dtype)           # S^T for the output warpgroup
            Vt_s = T.alloc_shared([BV, C], dtype)            # V_new^T for the output warpgroup
            O_s = T.alloc_shared([C, BV], dtype)
            St = T.alloc_fragment([BV, DK], ACCUM)           # the state, transposed
            St_op = T.alloc_fragment([BV, DK], dtype)        # ... as a GEMM operand
            Vt = T.alloc_fragment([BV, C], ACCUM)            # (W S)^T, then V_new^T
            Vt_op = T.alloc_fragment([BV, C], dtype)
            acc_o = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])
            data_free = T.alloc_barrier(arrive_count=[256, 256])
            s_ready = T.alloc_barrier(arrive_count=128)
            s_free = T.alloc_barrier(arrive_count=128)
            vn_ready = T.alloc_barrier(arrive_count=128)
            vn_free = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            if tx < 128:
                T.set_max_nreg(232, 1)                       # the chain holds S^T twice and (W S)^T
                for j, i in T.Parallel(BV, DK):
                    St[j, i] = h0[bb, bh, i, dv0 + j]
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.copy(St, St_op)
                    T.gemm(St_op, W_s[slot, :, :], Vt, transpose_B=True, clear_accum=True)
                    T.barrier_wait(s_free, (c + 1) % 2)
                    T.copy(St_op, St_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    for j, t in T.Parallel(BV, C):
                        Vt[j, t] = U_s[slot, t, j] - Vt[j, t]
                    T.copy(Vt, Vt_op)
                    for j, i in T.Parallel(BV, DK):
                        St[j, i] = St[j, i] * decay_s[slot, i]
                    T.gemm(Vt_op, Kw_s[slot, :, :], St)
                    T.barrier_wait(vn_free, (c + 1) % 2)
                    T.copy(Vt_op, Vt_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    T.barrier_arrive(data_free[slot])
                for j, i in T.Parallel(BV, DK):
                    ht[bb, bh, i, dv0 + j] = St[j, i]
            elif tx < 256:
                T.set_max_nreg(160, 0)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(s_ready, c % 2)
                    T.gemm(Qw_s[slot, :, :], St_s, acc_o, transpose_B=True, clear_accum=True)
                    T.barrier_arrive(s_free)
                    T.barrier_wait(vn_ready, c % 2)
                    T.gemm(A_s[slot, :, :], Vt_s, acc_o, transpose_B=True)
                    T.barrier_arrive(vn_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(acc_o, O_s)
                    T.copy(O_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])
            else:
                T.set_max_nreg(40, 0)
            if tx >= 256 and tx < 288:
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_free[slot], (c // 2 + 1) % 2)
                    rows = slice(c * C, (c + 1) * C)
                    T.tma_copy(Qw[bb, rows, bh, :], Qw_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(Kw[bb, rows, bh, :], Kw_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(W[bb, rows, bh, :], W_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(A_qk[bb, rows, bh, :], A_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(U[bb, rows, bh, dv0:dv0 + BV], U_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(decay[bb, bh, c, :], decay_s[slot, :], barrier=data_ready[slot])
                    T.barrier_arrive(data_ready[slot])

    return main


def factory(name):
    from kda.kernels import level5
    if name == "of record, 64 columns":
        return level5.gated_state_output_pass, dict(block_dv=64)
    if name == "of record, 32 columns":
        return level5.gated_state_output_pass, dict(block_dv=32)
    return state_pass_in_registers, {}


def compile_one(i):
    sys.path.insert(0, ROOT)
    if i == len(VARIANTS):
        from kda.kernels import level5
        return {"compile": "chunk_intra", **try_compile(lambda: level5.chunk_intra, dict(
            DK=128, DV=128, chunk_size=64, dtype="bfloat16", gate_dtype="float32"))}
    fn, extra = factory(VARIANTS[i])
    return {"compile": VARIANTS[i], **try_compile(lambda: fn, dict(DK=128, DV=128, dtype="bfloat16", **extra))}


def check():
    check_state_passes(RUN, factory, VARIANTS, SHAPES)


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
            log(RUN, {"what": "state pass", "variant": name, "shape": [B, T, H, D],
                      "ms": median_ms(state_pass_launch(*factory(name), form, h0)[2])})
        fn, _ = factory(VARIANTS[-1])
        level5.gated_state_output_pass = lambda block_dv=None, **p: fn(**p)   # every shape through it
        log(RUN, {"what": "chunk_kda", "variant": VARIANTS[-1], "shape": [B, T, H, D],
                  "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=False))})
        level5.gated_state_output_pass = adopted
        log(RUN, {"what": "chunk_kda", "variant": "of record (columns by state_pass_columns)", "shape": [B, T, H, D],
                  "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=False))})
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
