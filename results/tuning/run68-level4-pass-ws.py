"""Run 68 (H200, prepared): level 4's fused state/output pass warp-specialised by hand.

``kda.delta_rule`` at (1, 32768, 32, 128): 1.546 ms checked, 1.460 unchecked, against fla's
``chunk_delta_rule`` 2.101 (1.36x; #16's goal is 1.5x, about 1.40 ms). Its stages: ``chunk_wy``
0.757 ms, ``state_output_pass`` 0.693 ms (records of 1817ec5). The pass is level 1's pipelined loop
with the delta rule's chain: one warpgroup issues every GEMM of a chunk (``W S``, ``Q S``, ``Q K^T``,
``(Q K^T) V_new``, ``K^T V_new``) before the next chunk's state exists. Level 5's state pass, split
by hand into the chain and the output (run 39: 0.721 -> 0.607 ms), is the same computation with a
gate; level 3's scalar pass split the same way with two output warpgroups (run 61: 0.693 -> 0.561).

Here, level 4's pass in that form:

* warpgroup 0, the chain: ``S`` to shared memory (two copies, so that it can run a chunk ahead),
  ``W S``, ``V_new = U - W S`` to shared memory (two copies), ``S <- S + K^T V_new``;
* ``out_groups`` output warpgroups (alternate chunks with two): ``A = tril(Q K^T)`` before the
  chunk's state is needed, then ``Q S``, ``+ A V_new``, times ``scale``, the store;
* one producer warp loading q, k, W and the value columns of U by TMA into ``slots`` slots.

Every product and rounding is the pass of record's (bf16 ``S`` and ``V_new`` in shared memory, the
scores cast to bf16, ``scale`` at the end), so O and the final state should be bit-identical to
``kda.kernels.level4.state_output_pass``'s; the check says. Same signature: ``Q, K, W, U, scale,
h0, O, ht``.

    python results/tuning/run68-level4-pass-ws.py compile     # then each variant in its own process
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, each_in_process, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run68"


def delta_pass_ws(DK, DV, chunk_size=64, block_dv=32, dtype="bfloat16", slots=2, out_groups=1,
                  initial_state=False, final_state=False):
    import tilelang.language as T

    from kda.kernels.stages import ACCUM, load_state, real, state_shape, store_state
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)

    @T.macro
    def state_chain(K_s, W_s, U_s, S_s, Vn_s, S_f, WS, data_ready, data_free, s_ready, s_free, vn_ready, vn_free,
                    h0, ht, bb, bh, dv0):
        load_state(h0, S_f, bb, bh, dv0, initial_state)
        for c in T.serial(NC):
            slot = c % slots
            T.barrier_wait(data_ready[slot], (c // slots) % 2)
            T.barrier_wait(s_free[c % 2], (c // 2 + 1) % 2)          # the output of chunk c - 2 read it
            T.copy(S_f, S_s[c % 2, :, :])
            T.fence_proxy_async()
            T.barrier_arrive(s_ready[c % 2])
            T.gemm(W_s[slot, :, :], S_s[c % 2, :, :], WS, clear_accum=True)
            T.barrier_wait(vn_free[c % 2], (c // 2 + 1) % 2)
            for i, j in T.Parallel(C, BV):                    # rows past the end: 0 - 0 as loaded
                Vn_s[c % 2, i, j] = U_s[slot, i, j] - WS[i, j]
            T.fence_proxy_async()
            T.barrier_arrive(vn_ready[c % 2])
            T.gemm(K_s[slot, :, :], Vn_s[c % 2, :, :], S_f, transpose_A=True)
            T.barrier_arrive(data_free[slot])
        store_state(S_f, ht, bb, bh, dv0, final_state)

    @T.macro
    def output_chunks(w, Q_s, K_s, S_s, Vn_s, O_s, acc_o, QK, QK_cast, data_ready, data_free, s_ready, s_free,
                      vn_ready, vn_free, scale, O, bb, bh, dv0):
        for cc in T.serial(T.ceildiv(NC - w, out_groups)):
            c = cc * out_groups + w
            slot = c % slots
            T.barrier_wait(data_ready[slot], (c // slots) % 2)
            T.gemm(Q_s[slot, :, :], K_s[slot, :, :], QK, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                QK_cast[i, j] = QK[i, j] * real(j <= i)
            T.barrier_wait(s_ready[c % 2], (c // 2) % 2)
            T.gemm(Q_s[slot, :, :], S_s[c % 2, :, :], acc_o, clear_accum=True)
            T.barrier_arrive(s_free[c % 2])
            T.barrier_wait(vn_ready[c % 2], (c // 2) % 2)
            T.gemm(QK_cast, Vn_s[c % 2, :, :], acc_o)
            T.barrier_arrive(vn_free[c % 2])
            T.barrier_arrive(data_free[slot])
            for i, j in T.Parallel(C, BV):
                O_s[w, i, j] = acc_o[i, j] * scale
            T.copy(O_s[w, :, :], O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])

    @T.macro
    def load_chunks(Q, K, W, U, Q_s, K_s, W_s, U_s, data_ready, data_free, bb, bh, dv0):
        for c in T.serial(NC):
            slot = c % slots
            T.barrier_wait(data_free[slot], (c // slots + 1) % 2)
            rows = slice(c * C, (c + 1) * C)
            T.tma_copy(Q[bb, rows, bh, :], Q_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(K[bb, rows, bh, :], K_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(W[bb, rows, bh, :], W_s[slot, :, :], barrier=data_ready[slot])
            T.tma_copy(U[bb, rows, bh, dv0:dv0 + BV], U_s[slot, :, :], barrier=data_ready[slot])
            T.barrier_arrive(data_ready[slot])

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        scale: T.float32,
        h0: T.Tensor(state_shape(initial_state, B, H, DK, DV), ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(state_shape(final_state, B, H, DK, DV), ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=128 * (2 + out_groups)) as (bv, bh, bb):
            dv0 = bv * BV
            Q_s = T.alloc_shared([slots, C, DK], dtype)
            K_s = T.alloc_shared([slots, C, DK], dtype)
            W_s = T.alloc_shared([slots, C, DK], dtype)
            U_s = T.alloc_shared([slots, C, BV], dtype)
            S_s = T.alloc_shared([2, DK, BV], dtype)
            Vn_s = T.alloc_shared([2, C, BV], dtype)
            O_s = T.alloc_shared([out_groups, C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            WS = T.alloc_fragment([C, BV], ACCUM)
            acc_o = T.alloc_fragment([C, BV], ACCUM)
            QK = T.alloc_fragment([C, C], ACCUM)
            QK_cast = T.alloc_fragment([C, C], dtype)
            acc_o_1 = T.alloc_fragment([C, BV], ACCUM)          # the second output warpgroup's
            QK_1 = T.alloc_fragment([C, C], ACCUM)
            QK_cast_1 = T.alloc_fragment([C, C], dtype)
            data_ready = T.alloc_barrier(arrive_count=[32] * slots)
            data_free = T.alloc_barrier(arrive_count=[256] * slots)
            s_ready = T.alloc_barrier(arrive_count=[128, 128])
            s_free = T.alloc_barrier(arrive_count=[128, 128])
            vn_ready = T.alloc_barrier(arrive_count=[128, 128])
            vn_free = T.alloc_barrier(arrive_count=[128, 128])
            tx = T.get_thread_binding()
            if tx < 128:
                state_chain(K_s, W_s, U_s, S_s, Vn_s, S_f, WS, data_ready, data_free, s_ready, s_free, vn_ready,
                            vn_free, h0, ht, bb, bh, dv0)
            if tx >= 128 and tx < 256:
                output_chunks(0, Q_s, K_s, S_s, Vn_s, O_s, acc_o, QK, QK_cast, data_ready, data_free, s_ready,
                              s_free, vn_ready, vn_free, scale, O, bb, bh, dv0)
            if out_groups > 1:
                if tx >= 256 and tx < 384:
                    output_chunks(1, Q_s, K_s, S_s, Vn_s, O_s, acc_o_1, QK_1, QK_cast_1, data_ready, data_free,
                                  s_ready, s_free, vn_ready, vn_free, scale, O, bb, bh, dv0)
            if tx >= 128 * (1 + out_groups) and tx < 128 * (1 + out_groups) + 32:
                load_chunks(Q, K, W, U, Q_s, K_s, W_s, U_s, data_ready, data_free, bb, bh, dv0)

    return main


delta_pass_ws.pass_configs = {"tl.disable_shared_memory_reuse": True}    # build.WARP_SPECIALISED

VARIANTS = {"ws, 1 output group, 2 slots": dict(slots=2, out_groups=1),
            "ws, 2 output groups, 2 slots": dict(slots=2, out_groups=2),
            "ws, 2 output groups, 3 slots": dict(slots=3, out_groups=2)}
NAMES = list(VARIANTS)


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name = NAMES[i % len(NAMES)]
    states = i >= len(NAMES)
    row = {"what": "compile", "variant": name, "states": states}
    try:
        kernel = compile_program(delta_pass_ws, (), target=SM90A, DK=128, DV=128, dtype="bfloat16",
                                 initial_state=states, final_state=states, **VARIANTS[name])
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-800:]}


def check_and_time(name):
    """O and the final state of ``name`` bit for bit against ``state_output_pass`` (tails, states,
    and the float64 recurrence), then the pass timed at the headline shape beside the pass of record."""
    import torch

    from kda.bench import median_ms, random_qkv
    from kda.kernels import level4
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4

    def prepared(B, T, H, seed):
        q, k, v = random_qkv(B, T, H, 128, 128, seed=seed)
        k = ref4.l2_normalize(k.float()).bfloat16()
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        beta = torch.rand(B, T, H, generator=gen, device="cuda")
        W, U = torch.empty_like(k), torch.empty_like(v)
        wy = compile_program(level4.chunk_wy, (), DK=128, DV=128, dtype="bfloat16")
        wy(k, v, beta, W, U, torch.empty(1, 1, 1, 1, device="cuda"), torch.zeros(2, dtype=torch.int32, device="cuda"))
        return q, k, v, beta, W, U

    record = lambda states: compile_program(level4.state_output_pass, (), DK=128, DV=128, dtype="bfloat16",
                                            initial_state=states, final_state=states)
    ours = None if name == "of record" else (
        lambda states: compile_program(delta_pass_ws, (), DK=128, DV=128, dtype="bfloat16", initial_state=states,
                                       final_state=states, **VARIANTS[name]))
    scale = 128 ** -0.5
    if ours is not None:
        for B, T, H in [(2, 1000 + 37, 4), (1, 64 * 7, 3), (1, 64 * 7 + 1, 3), (1, 8192, 32)]:
            q, k, v, beta, W, U = prepared(B, T, H, seed=T)
            h0 = torch.randn(B, H, 128, 128, device="cuda")
            o0, ht0 = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
            record(True)(q, k, W, U, scale, h0, o0, ht0)
            o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
            ours(True)(q, k, W, U, scale, h0, o, ht)
            torch.cuda.synchronize()
            row = {"what": "check", "variant": name, "shape": [B, T, H, 128],
                   "nan": bool(o.isnan().any() or ht.isnan().any()),
                   "o_equal_to_record": bool(torch.equal(o, o0)), "ht_equal_to_record": bool(torch.equal(ht, ht0))}
            if T < 2000:
                ref_o, ref_ht = ref4.recurrent(q.double() * scale, k, v, beta, h0, True)
                row.update(o_rel=rel_l2(o, ref_o), ht_rel=rel_l2(ht, ref_ht))
            log(RUN, row)
    q, k, v, beta, W, U = prepared(1, 32768, 32, seed=68)
    o = torch.empty_like(v)
    stand_in = torch.empty(1, 1, 1, 1, device="cuda")
    kern = record(False) if ours is None else ours(False)
    log(RUN, {"what": "time", "variant": name, "T": 32768, "stage": "pass",
              "ms": median_ms(lambda: kern(q, k, W, U, scale, stand_in, o, stand_in))})
    if ours is None:
        from fla.ops.delta_rule import chunk_delta_rule

        import kda
        for label, fn in {"kda.delta_rule": lambda: kda.delta_rule(q, k, v, beta),
                          "kda.delta_rule, check_values=False": lambda: kda.delta_rule(q, k, v, beta, check_values=False),
                          "fla chunk_delta_rule": lambda: chunk_delta_rule(q, k, v, beta, scale=scale)[0]}.items():
            log(RUN, {"what": "time", "variant": name, "T": 32768, "stage": label, "ms": median_ms(fn)})


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_in_processes(RUN, 2 * len(NAMES), compile_one)
    each_in_process(RUN, ["of record"] + NAMES, check_and_time, limit_s=100)
