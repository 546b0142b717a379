"""Run 56 (H200): GDN's pass with kda's chain and ``W``, ``U`` made one chunk ahead beside it.

Run 55 showed that the chain of kda's pass (two GEMMs: ``W S`` and ``K^T V'``, no hand-over) is not
enough: the pass that read the raw ``q, k`` took 1.46 ms at (1, 32768, 32, 128), kda's pass on
``chunk_intra``'s output 0.61. Its output warpgroup formed ``Q K^T`` as well, and the chain waited for
it every chunk; and its kernel 1 (``W``, ``U`` beside the inverse) took 1.02 ms, no faster than
``chunk_intra``. Run 53 had made ``W`` and ``U`` inside the pass, but with single buffers the chain
and their warpgroup ran one after the other (2.07 ms).

Here: kernel 1 is run 53's ``gdn_inverse`` at 128 threads (0.45 ms in run 54: ``Tb = T diag(b)`` and
``G`` only). The pass, 512 threads:

* warpgroup 0, the chain, as kda's: ``S`` to shared memory, ``W S``, ``V_new = U - W S``,
  ``S <- 2^G_last S + K^T (2^(G_last - G) V_new)``;
* warpgroup 1 makes ``W = Tb (K 2^G)`` and ``U = Tb V`` into two slots, so that chunk ``c + 1``'s are
  made while the chain works on chunk ``c``;
* warpgroup 2, the output: ``P = causal(scale Q K^T 2^(G_i - G_j))``, ``O = scale 2^G (Q S) + P V_new``;
* one producer warp: ``q, k, v, Tb`` by TMA, ``G``, ``2^G``, ``2^(G_last - G)`` per row.

Every factor is ``2^x``, ``x <= 0``. Fast math (tilelang's) as in runs 54-55.

    python results/tuning/run56-gdn-wu-ahead.py compile check time     # first call
    python results/tuning/run56-gdn-wu-ahead.py diagnose               # second call
"""
import importlib.util
import os
import sys

import tilelang.language as T

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run56"
ACCUM = "float32"
FAST_MATH = {"tl.enable_fast_math": True}


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gdn_pass_wu_ahead(DK, DV, chunk_size=64, block_dv=32, dtype="bfloat16", a_from_input=False):
    """Arguments ``Q, K [B, T, H, DK]``, ``V [B, T, H, DV]``, ``Tb [B, T, H, C]`` (dtype), ``G [B, T, H]``
    (float32, log2 chunk-local cumsum), ``scale``, ``h0 [B, H, DK, DV]``; outputs ``O`` and ``ht``. Rows
    past ``T`` load as zeros (TMA) and ``G`` there repeats the last row's. ``a_from_input`` (second
    call, a diagnosis): the output reads ``P`` from one more argument ``A [B, T, H, C]`` (kda's
    ``A_qk``, scale included) by TMA instead of forming ``Q K^T`` and its decay."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        Tb: T.Tensor([B, S, H, C], dtype),
        G: T.Tensor([B, S, H], ACCUM),
        scale: T.float32,
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
        A: T.Tensor([B, S, H, C], dtype),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=512) as (bv, bh, bb):
            dv0 = bv * BV
            q_s = T.alloc_shared([2, C, DK], dtype)          # data slots: chunk c in slot c % 2
            k_s = T.alloc_shared([2, C, DK], dtype)
            v_s = T.alloc_shared([2, C, BV], dtype)
            tb_s = T.alloc_shared([2, C, C], dtype)
            G_s = T.alloc_shared([2, C], ACCUM)
            E_s = T.alloc_shared([2, C], ACCUM)              # 2^G
            R_s = T.alloc_shared([2, C], ACCUM)              # 2^(G_last - G)
            w_s = T.alloc_shared([2, C, DK], dtype)          # W and U slots, chunk c in slot c % 2
            u_s = T.alloc_shared([2, C, BV], dtype)
            kg_s = T.alloc_shared([C, DK], dtype)            # K 2^G, warpgroup 1's own
            S_s = T.alloc_shared([DK, BV], dtype)
            vn_s = T.alloc_shared([C, BV], dtype)            # V_new, for the output
            vw_s = T.alloc_shared([C, BV], dtype)            # 2^(G_last - G) V_new, for the chain
            p_s = T.alloc_shared([C, C], dtype)
            a_s = T.alloc_shared([2, C, C] if a_from_input else [1, 1, 1], dtype)
            o_s = T.alloc_shared([C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            WS = T.alloc_fragment([C, BV], ACCUM)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, BV], ACCUM)
            P_f = T.alloc_fragment([C, C], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[384, 384])     # the three warpgroups
            wu_ready = T.alloc_barrier(arrive_count=[128, 128])      # warpgroup 1 -> chain
            wu_free = T.alloc_barrier(arrive_count=[128, 128])       # chain -> warpgroup 1
            s_ready = T.alloc_barrier(arrive_count=128)              # chain -> output
            s_free = T.alloc_barrier(arrive_count=128)
            vn_ready = T.alloc_barrier(arrive_count=128)
            vn_free = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            # slot barriers: chunk c is use c // 2 of its slot, a wait for parity (c // 2 + 1) % 2 passes
            # at the first use; single barriers: a wait for parity (c + 1) % 2 passes at c = 0
            if tx < 128:                                             # the chain
                T.copy(h0[bb, bh, :, dv0:dv0 + BV], S_f)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(s_free, (c + 1) % 2)
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    T.barrier_wait(wu_ready[slot], (c // 2) % 2)
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
                    T.barrier_arrive(wu_free[slot])
                    T.barrier_arrive(data_free[slot])
                T.copy(S_f, ht[bb, bh, :, dv0:dv0 + BV])
            elif tx < 256:                                           # W and U, a chunk ahead
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    for i, d in T.Parallel(C, DK):
                        kg_s[i, d] = k_s[slot, i, d] * E_s[slot, i]
                    T.fence_proxy_async()
                    T.gemm(tb_s[slot, :, :], kg_s, W_f, clear_accum=True)
                    T.gemm(tb_s[slot, :, :], v_s[slot, :, :], U_f, clear_accum=True)
                    T.barrier_wait(wu_free[slot], (c // 2 + 1) % 2)
                    T.copy(W_f, w_s[slot, :, :])
                    T.copy(U_f, u_s[slot, :, :])
                    T.fence_proxy_async()
                    T.barrier_arrive(wu_ready[slot])
                    T.barrier_arrive(data_free[slot])
            elif tx < 384:                                           # the output
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    if not a_from_input:
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
                    if a_from_input:
                        T.gemm(a_s[slot, :, :], vn_s, O_f)
                    else:
                        T.gemm(p_s, vn_s, O_f)
                    T.barrier_arrive(vn_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(O_f, o_s)
                    T.copy(o_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])
            elif tx < 416:                                           # the producer warp
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_free[slot], (c // 2 + 1) % 2)
                    rows = slice(c * C, (c + 1) * C)
                    T.tma_copy(Q[bb, rows, bh, :], q_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(K[bb, rows, bh, :], k_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], v_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(Tb[bb, rows, bh, :], tb_s[slot, :, :], barrier=data_ready[slot])
                    if a_from_input:
                        T.tma_copy(A[bb, rows, bh, :], a_s[slot, :, :], barrier=data_ready[slot])
                    for i in T.Parallel(C):
                        G_s[slot, i] = G[bb, T.min(c * C + i, S - 1), bh]
                        E_s[slot, i] = T.exp2(G[bb, T.min(c * C + i, S - 1), bh])
                        R_s[slot, i] = T.exp2(G[bb, T.min(c * C + C - 1, S - 1), bh] - G[bb, T.min(c * C + i, S - 1), bh])
                    T.barrier_arrive(data_ready[slot])

    return main


WIDTHS = (32, 64)


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    bv = WIDTHS[i]
    try:
        kernel = compile_program(gdn_pass_wu_ahead, (), target=SM90A, pass_configs=FAST_MATH, DK=128, DV=128,
                                 block_dv=bv)
        return {"what": "compile", "block_dv": bv, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {"what": "compile", "block_dv": bv, "error": repr(e)[-600:]}


def compile_all():
    from harness import compile_in_processes
    compile_in_processes(RUN, len(WIDTHS), compile_one)


def inverse_launch(r53, k, g, beta):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = k.shape
    kernel = compile_program(r53.gdn_inverse, (), DK=D, dtype="bfloat16", threads=128)
    G = torch.full((B, Tn, H), float("nan"), device=k.device)
    Tb = torch.full((B, Tn, H, 64), float("nan"), dtype=k.dtype, device=k.device)
    kernel(k, g[..., None].contiguous(), beta.float().contiguous(), G, Tb,
           torch.zeros(2, dtype=torch.int32, device=k.device))
    return Tb, G


def pass_launch(q, k, v, Tb, G, scale, h0, block_dv, A=None):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = q.shape
    kernel = compile_program(gdn_pass_wu_ahead, (), pass_configs=FAST_MATH, DK=D, DV=v.shape[-1], block_dv=block_dv,
                             a_from_input=A is not None)
    o = torch.full_like(v, float("nan"))
    ht = torch.full((B, H, D, v.shape[-1]), float("nan"), device=q.device)
    A = A if A is not None else torch.empty(B, Tn, H, 64, dtype=q.dtype, device=q.device)
    kernel(q, k, v, Tb, G, scale, h0, o, ht, A)
    return o, ht


def check(r53):
    import torch

    import kda
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    for shape, gate in [((2, 1000, 4, 128), "logsigmoid"), ((2, 1000, 4, 128), "runs_of_-20"),
                        ((1, 32768, 32, 128), "logsigmoid")]:
        B, Tn, H, D = shape
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=56)
        if gate == "runs_of_-20":
            g[:, 40:110] = -20.0
        h0 = torch.randn(B, H, D, D, device="cuda")
        o_k, ht_k = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        small = Tn <= 1000
        if small:
            o_r, ht_r = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
        Tb, G = inverse_launch(r53, k, g, beta)
        for bv in WIDTHS:
            try:
                o, ht = pass_launch(q, k, v, Tb, G, D ** -0.5, h0, bv)
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

    import kda
    from kda.bench import median_ms
    for B, Tn, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=5)
        h0 = torch.zeros(B, H, D, D, device="cuda")
        base = {"what": "time", "shape": [B, Tn, H, D]}
        Tb, G = inverse_launch(r53, k, g, beta)
        log(RUN, {**base, "impl": "gdn_inverse, 128 threads", "ms": median_ms(lambda: inverse_launch(r53, k, g, beta))})
        for bv in WIDTHS:
            try:
                log(RUN, {**base, "impl": f"pass, W and U ahead, {bv} columns",
                          "ms": median_ms(lambda: pass_launch(q, k, v, Tb, G, D ** -0.5, h0, bv))})
                log(RUN, {**base, "impl": f"gdn_inverse + pass, {bv} columns", "ms": median_ms(
                    lambda: pass_launch(q, k, v, *inverse_launch(r53, k, g, beta), D ** -0.5, h0, bv))})
            except Exception as e:  # noqa: BLE001
                log(RUN, {**base, "impl": f"pass, W and U ahead, {bv} columns", "error": repr(e)[-600:]})
        log(RUN, {**base, "impl": "kda chunk_gated_delta_rule", "ms": median_ms(lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta))})


def diagnose(r53):
    """Second call: the pass with ``P`` read from kda's ``A_qk``: checked, then timed."""
    import torch

    from kda.bench import median_ms
    from kda.gated_delta import prepare_chunks
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    for B, Tn, H, D in [(2, 1000, 4, 128), (1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=56)
        h0 = torch.randn(B, H, D, D, device="cuda")
        A = prepare_chunks(q, k, v, g[..., None].contiguous(), beta, D ** -0.5).A_qk
        Tb, G = inverse_launch(r53, k, g, beta)
        base = {"shape": [B, Tn, H, D], "impl": "pass, W and U ahead, P from kda's A_qk"}
        for bv in WIDTHS:
            try:
                o, ht = pass_launch(q, k, v, Tb, G, D ** -0.5, h0, bv, A)
                row = {"what": "check", **base, "block_dv": bv, "nan": bool(o.isnan().any() or ht.isnan().any())}
                if Tn <= 1000:
                    o_r, ht_r = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
                    row.update(o_vs_float64=rel_l2(o, o_r), ht_vs_float64=rel_l2(ht, ht_r))
                log(RUN, row)
                if Tn > 1000:
                    log(RUN, {"what": "time", **base, "block_dv": bv,
                              "ms": median_ms(lambda: pass_launch(q, k, v, Tb, G, D ** -0.5, h0, bv, A))})
            except Exception as e:  # noqa: BLE001
                log(RUN, {"what": "check", **base, "block_dv": bv, "error": repr(e)[-600:]})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    r53 = load("run53", "run53-gdn-fused-pass.py")
    if "compile" in steps:
        compile_all()
    if "check" in steps:
        check(r53)
    if "time" in steps:
        time_all(r53)
    if "diagnose" in steps:
        diagnose(r53)
