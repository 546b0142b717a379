"""Run 55 (H200): GDN as two kernels, ``W`` and ``U`` made beside the inverse, the chain of kda's pass.

Runs 53 and 54 moved ``W`` out of HBM: the pass formed ``K S`` and ``Tb (V - 2^G K S)`` in a
warpgroup beside the chain (FlashQLA's arrangement). It is correct, but the chain then waits for
two hand-overs and three GEMMs per chunk: 1.40 ms for the pass at (1, 32768, 32, 128) (fast
math), FlashQLA's own 0.99, while kda's state pass on ``chunk_intra``'s output takes 0.61 with two
GEMMs and no hand-over in its chain. This run keeps that chain and moves the rest:

* kernel 1 (``gdn_wu``), every chunk at once: the gate's cumsum ``G`` (log2), the gated inverse
  ``Tb = T diag(b)`` in shared memory (run 53's ``gdn_inverse``), then ``W = Tb (K 2^G)`` and
  ``U = Tb V``, written in bf16 with ``G``; ``A_kk``, ``Tb``, ``Qw``, ``Kw`` and ``A_qk`` never reach
  HBM (kda's ``chunk_intra`` writes ``Qw, Kw, W, U`` and ``A_qk``: 2.0 GB moved at the headline shape
  against 1.1 GB here);
* kernel 2 (``gdn_pass_wu``), 384 threads: warpgroup 0 the chain (``S`` to shared memory, ``W S``,
  ``V_new = U - W S``, ``S <- 2^G_last S + K^T (2^(G_last - G) V_new)``); warpgroup 1 the output
  from the raw ``q, k`` (``P = causal(scale Q K^T 2^(G_i - G_j))``, ``O = scale 2^G (Q S) + P
  V_new``); one producer warp loads ``q, k, W, U`` by TMA and writes ``G``, ``2^G`` and
  ``2^(G_last - G)`` per row.

Every factor is ``2^x`` with ``x <= 0``: exact for any gate, runs of -20 included.

* ``compile``: both kernels for sm_90a in parallel processes (registers, spills);
* ``check``: O and ht against the float64 recurrence and ``kda.chunk_gated_delta_rule`` at
  (2, 1000, 4, 128) with h0 (logsigmoid gates and runs of -20) and at (1, 32768, 32, 128);
* ``time``: each kernel, the pair, kda's GDN and its stages, FlashQLA's kernels and op.

    python results/tuning/run55-gdn-wu-pass.py compile check time
"""
import importlib.util
import os
import sys

import tilelang.language as T

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run55"
ACCUM = "float32"
FAST_MATH = {"tl.enable_fast_math": True}


def run53():
    spec = importlib.util.spec_from_file_location("run53", os.path.join(HERE, "run53-gdn-fused-pass.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gdn_wu(DK, DV, chunk_size=64, dtype="bfloat16", threads=128):
    """``G`` (log2 cumsum, float32 ``[B, T, H]``), ``W = Tb (K 2^G)`` (``[B, T, H, DK]``) and ``U = Tb V``
    (``[B, T, H, DV]``, dtype) from ``K``, ``V``, ``g [B, T, H, 1]`` and ``beta [B, T, H]`` (float32);
    last argument ``flags [2]`` (int32, as ``chunk_intra``)."""
    from kda.kernels.level5 import SOLVE_BLOCK, invert_diagonal_blocks_by_columns, log2_cumsum_by_columns
    from kda.kernels.stages import decay_factor, merge_by_substitution

    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        g: T.Tensor([B, S, H, 1], ACCUM),
        beta: T.Tensor([B, S, H], ACCUM),
        G: T.Tensor([B, S, H], ACCUM),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
            t0 = c * C
            L = T.min(C, S - t0)
            K_s = T.alloc_shared([C, DK], dtype)
            V_s = T.alloc_shared([C, DV], dtype)
            Kg_s = T.alloc_shared([C, DK], dtype)
            G_s = T.alloc_shared([C, 1], ACCUM)
            beta_s = T.alloc_shared([C], ACCUM)
            A = T.alloc_fragment([C, C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, DV], ACCUM)
            W_s = T.alloc_shared([C, DK], dtype)
            U_s = T.alloc_shared([C, DV], dtype)
            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            T.copy(K[bb, t0:t0 + C, bh, :], K_s)
            T.copy(V[bb, t0:t0 + C, bh, :], V_s)
            T.copy(g[bb, t0:t0 + C, bh, :], G_s)
            log2_cumsum_by_columns(G_s, G_s, L, C, 1, flags)
            for i in T.Parallel(C):
                beta_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
            T.gemm(K_s, K_s, A, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                A_s[i, j] = T.if_then_else(j < i, A[i, j] * beta_s[i] * decay_factor(G_s[i, 0] - G_s[j, 0]), 0.0)
            for i, d in T.Parallel(C, DK):
                Kg_s[i, d] = K_s[i, d] * T.exp2(G_s[i, 0])
            invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)
            merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)
            for i, j in T.Parallel(C, C):     # blocks above the diagonal are not written: read as 0
                Tb_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j] * beta_s[j], 0.0)
            T.gemm(Tb_s, Kg_s, W_f, clear_accum=True)
            T.gemm(Tb_s, V_s, U_f, clear_accum=True)
            T.copy(W_f, W_s)
            T.copy(U_f, U_s)
            T.copy(W_s, W[bb, t0:t0 + C, bh, :])
            T.copy(U_s, U[bb, t0:t0 + C, bh, :])
            for i in T.Parallel(C):
                if i < L:
                    G[bb, t0 + i, bh] = G_s[i, 0]

    return main


def gdn_pass_wu(DK, DV, chunk_size=64, block_dv=32, dtype="bfloat16", nreg=None):
    """Arguments ``Q, K, W [B, T, H, DK]``, ``U [B, T, H, DV]`` (dtype), ``G [B, T, H]`` (float32),
    ``scale``, ``h0 [B, H, DK, DV]``; outputs ``O [B, T, H, DV]`` and ``ht``. Rows past ``T`` load as
    zeros (TMA) and ``G`` there repeats the last row's. ``nreg``: registers per thread of the chain,
    the output and the producer warpgroups (``setmaxnreg``), for 128 value columns."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        W: T.Tensor([B, S, H, DK], dtype),
        U: T.Tensor([B, S, H, DV], dtype),
        G: T.Tensor([B, S, H], ACCUM),
        scale: T.float32,
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=384) as (bv, bh, bb):
            dv0 = bv * BV
            q_s = T.alloc_shared([2, C, DK], dtype)          # two slots: chunk c in slot c % 2
            k_s = T.alloc_shared([2, C, DK], dtype)
            w_s = T.alloc_shared([2, C, DK], dtype)
            u_s = T.alloc_shared([2, C, BV], dtype)
            G_s = T.alloc_shared([2, C], ACCUM)
            E_s = T.alloc_shared([2, C], ACCUM)              # 2^G
            R_s = T.alloc_shared([2, C], ACCUM)              # 2^(G_last - G)
            S_s = T.alloc_shared([DK, BV], dtype)
            vn_s = T.alloc_shared([C, BV], dtype)            # V_new, for the output
            vw_s = T.alloc_shared([C, BV], dtype)            # 2^(G_last - G) V_new, for the chain
            p_s = T.alloc_shared([C, C], dtype)
            o_s = T.alloc_shared([C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            WS = T.alloc_fragment([C, BV], ACCUM)
            P_f = T.alloc_fragment([C, C], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[256, 256])     # both warpgroups
            s_ready = T.alloc_barrier(arrive_count=128)
            s_free = T.alloc_barrier(arrive_count=128)
            vn_ready = T.alloc_barrier(arrive_count=128)
            vn_free = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            # a wait for parity (c + 1) % 2 passes at c = 0 and then waits for chunk c - 1's arrival
            if tx < 128:                                             # the chain
                if nreg is not None:
                    T.set_max_nreg(nreg[0], 1)
                T.copy(h0[bb, bh, :, dv0:dv0 + BV], S_f)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(s_free, (c + 1) % 2)
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    T.gemm(w_s[slot, :, :], S_s, WS, clear_accum=True)
                    T.barrier_wait(vn_free, (c + 1) % 2)
                    for i, j in T.Parallel(C, BV):
                        vn_s[i, j] = u_s[slot, i, j] - WS[i, j]
                        vw_s[i, j] = (u_s[slot, i, j] - WS[i, j]) * R_s[slot, i]
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    for i, j in T.Parallel(DK, BV):
                        S_f[i, j] = S_f[i, j] * E_s[slot, C - 1]
                    T.gemm(k_s[slot, :, :], vw_s, S_f, transpose_A=True)
                    T.barrier_arrive(data_free[slot])
                T.copy(S_f, ht[bb, bh, :, dv0:dv0 + BV])
            elif tx < 256:                                           # the output
                if nreg is not None:
                    T.set_max_nreg(nreg[1], 1)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.gemm(q_s[slot, :, :], k_s[slot, :, :], P_f, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(C, C):
                        p_s[i, j] = T.if_then_else(
                            j <= i, P_f[i, j] * scale * T.exp2(T.min(G_s[slot, i] - G_s[slot, j], 0.0)), 0.0)
                    T.fence_proxy_async()
                    T.barrier_wait(s_ready, c % 2)
                    T.gemm(q_s[slot, :, :], S_s, O_f, clear_accum=True)
                    T.barrier_arrive(s_free)
                    for i, j in T.Parallel(C, BV):
                        O_f[i, j] = O_f[i, j] * (scale * E_s[slot, i])
                    T.barrier_wait(vn_ready, c % 2)
                    T.gemm(p_s, vn_s, O_f)
                    T.barrier_arrive(vn_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(O_f, o_s)
                    T.copy(o_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])
            else:                                                    # the producer warp
                if nreg is not None:
                    T.set_max_nreg(nreg[2], 0)
                if tx < 288:
                    for c in T.serial(NC):
                        slot = c % 2
                        T.barrier_wait(data_free[slot], (c // 2 + 1) % 2)
                        rows = slice(c * C, (c + 1) * C)
                        T.tma_copy(Q[bb, rows, bh, :], q_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(K[bb, rows, bh, :], k_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(W[bb, rows, bh, :], w_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(U[bb, rows, bh, dv0:dv0 + BV], u_s[slot, :, :], barrier=data_ready[slot])
                        for i in T.Parallel(C):
                            G_s[slot, i] = G[bb, T.min(c * C + i, S - 1), bh]
                            E_s[slot, i] = T.exp2(G[bb, T.min(c * C + i, S - 1), bh])
                            R_s[slot, i] = T.exp2(G[bb, T.min(c * C + C - 1, S - 1), bh] - G[bb, T.min(c * C + i, S - 1), bh])
                        T.barrier_arrive(data_ready[slot])

    return main


WIDTHS = (32, 64)     # 128 with setmaxnreg (232, 160, 40): illegal instruction on the H200 (first call)
KERNELS = [("gdn_wu", 128), ("gdn_wu", 256)] + [("gdn_pass_wu", bv) for bv in WIDTHS]
NREG = {128: (232, 160, 40)}


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name, p = KERNELS[i]
    row = {"what": "compile", "kernel": name, "param": p}
    try:
        if name == "gdn_wu":
            kernel = compile_program(gdn_wu, (), target=SM90A, pass_configs=FAST_MATH, DK=128, DV=128, threads=p)
        else:
            kernel = compile_program(gdn_pass_wu, (), target=SM90A, pass_configs=FAST_MATH, DK=128, DV=128, block_dv=p,
                                     nreg=NREG.get(p))
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-600:]}


def compile_all():
    from harness import compile_in_processes
    compile_in_processes(RUN, len(KERNELS), compile_one)


def wu_launch(k, v, g, beta, threads=128):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = k.shape
    kernel = compile_program(gdn_wu, (), pass_configs=FAST_MATH, DK=D, DV=v.shape[-1], threads=threads)
    G = torch.full((B, Tn, H), float("nan"), device=k.device)
    W = torch.full_like(k, float("nan"))
    U = torch.full_like(v, float("nan"))
    kernel(k, v, g[..., None].contiguous(), beta.float().contiguous(), G, W, U,
           torch.zeros(2, dtype=torch.int32, device=k.device))
    return W, U, G


def pass_launch(q, k, W, U, G, scale, h0, block_dv):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = q.shape
    kernel = compile_program(gdn_pass_wu, (), pass_configs=FAST_MATH, DK=D, DV=U.shape[-1], block_dv=block_dv,
                             nreg=NREG.get(block_dv))
    o = torch.full_like(U, float("nan"))
    ht = torch.full((B, H, D, U.shape[-1]), float("nan"), device=q.device)
    kernel(q, k, W, U, G, scale, h0, o, ht)
    return o, ht


def check(r53):
    import torch

    import kda
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    for shape, gate in [((2, 1000, 4, 128), "logsigmoid"), ((2, 1000, 4, 128), "runs_of_-20"),
                        ((1, 32768, 32, 128), "logsigmoid")]:
        B, Tn, H, D = shape
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=55)
        if gate == "runs_of_-20":
            g[:, 40:110] = -20.0
        h0 = torch.randn(B, H, D, D, device="cuda")
        o_k, ht_k = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        small = Tn <= 1000
        if small:
            o_r, ht_r = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
        for threads in (128, 256):
            W, U, G = wu_launch(k, v, g, beta, threads)
            log(RUN, {"what": "check", "kernel": "gdn_wu", "threads": threads, "shape": list(shape), "gate": gate,
                      "nan": bool(W.isnan().any() or U.isnan().any() or G.isnan().any())})
        for bv in WIDTHS:
            try:
                o, ht = pass_launch(q, k, W, U, G, D ** -0.5, h0, bv)
            except Exception as e:  # noqa: BLE001
                log(RUN, {"what": "check", "shape": list(shape), "block_dv": bv, "error": repr(e)[-600:]})
                continue
            row = {"what": "check", "shape": list(shape), "gate": gate, "block_dv": bv,
                   "nan": bool(o.isnan().any() or ht.isnan().any()),
                   "o_vs_kda": rel_l2(o, o_k), "ht_vs_kda": rel_l2(ht, ht_k)}
            if small:
                row.update(o_vs_float64=rel_l2(o, o_r), ht_vs_float64=rel_l2(ht, ht_r),
                           kda_o_vs_float64=rel_l2(o_k, o_r), kda_ht_vs_float64=rel_l2(ht_k, ht_r))
            log(RUN, row)


def time_all(r53):
    import torch

    import flash_qla
    import kda
    from flash_qla.ops.gated_delta_rule.chunk.hopper import fused_gdr_fwd, kkt_solve
    from flash_qla.ops.utils import chunk_local_cumsum
    from kda.bench import median_ms
    from kda.gated_delta import prepare_chunks, run_state_pass
    for B, Tn, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=5)
        h0 = torch.zeros(B, H, D, D, device="cuda")
        base = {"what": "time", "shape": [B, Tn, H, D]}
        W, U, G = wu_launch(k, v, g, beta)
        for threads in (128, 256):
            log(RUN, {**base, "impl": f"gdn_wu, {threads} threads", "ms": median_ms(lambda: wu_launch(k, v, g, beta, threads))})
        for bv in WIDTHS:
            try:
                log(RUN, {**base, "impl": f"gdn_pass_wu, {bv} columns",
                          "ms": median_ms(lambda: pass_launch(q, k, W, U, G, D ** -0.5, h0, bv))})
                log(RUN, {**base, "impl": f"gdn_wu + gdn_pass_wu, {bv} columns",
                          "ms": median_ms(lambda: pass_launch(q, k, *wu_launch(k, v, g, beta), D ** -0.5, h0, bv))})
            except Exception as e:  # noqa: BLE001
                log(RUN, {**base, "impl": f"gdn_pass_wu, {bv} columns", "error": repr(e)[-600:]})
        form = prepare_chunks(q, k, v, g[..., None].contiguous(), beta, D ** -0.5)
        log(RUN, {**base, "impl": "kda state pass on chunk_intra's output", "ms": median_ms(lambda: run_state_pass(form, None))})
        log(RUN, {**base, "impl": "kda chunk_intra, scalar path", "ms": median_ms(
            lambda: prepare_chunks(q, k, v, g[..., None].contiguous(), beta, D ** -0.5))})
        log(RUN, {**base, "impl": "kda chunk_gated_delta_rule", "ms": median_ms(lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta))})
        gc = chunk_local_cumsum(g=g, chunk_size=64)
        a = kkt_solve(k=k, b=beta, chunk_size=64)
        log(RUN, {**base, "impl": "FlashQLA kkt_solve", "ms": median_ms(lambda: kkt_solve(k=k, b=beta, chunk_size=64))})
        log(RUN, {**base, "impl": "FlashQLA fused_gdr_fwd", "ms": median_ms(lambda: fused_gdr_fwd(
            q=q, k=k, v=v, a=a, g=gc, b=beta, scale=D ** -0.5, initial_state=h0, output_final_state=True))})
        for auto_cp in (False, True):
            log(RUN, {**base, "impl": f"FlashQLA chunk_gated_delta_rule, auto_cp={auto_cp}", "ms": median_ms(
                lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5, auto_cp=auto_cp))})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    r53 = run53()
    if "compile" in steps:
        compile_all()
    if "check" in steps:
        check(r53)
    if "time" in steps:
        time_all(r53)
