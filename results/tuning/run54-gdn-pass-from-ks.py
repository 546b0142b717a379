"""Run 54 (H200): GDN's sequential pass without ``W``: ``V_new = Tb (V - 2^G K S)``.

Run 53's pass formed ``W = Tb (K 2^G)`` (a 64 x 64 x 128 GEMM per chunk and value block) and
``U = Tb V`` in a warpgroup whose buffers the chain released only at the end of its chunk, so the
two ran one after the other: 2.07 ms for the pass alone at (1, 32768, 32, 128), against 0.61 for
kda's state pass on ``chunk_intra``'s output. FlashQLA's pass (read in its wheel) never forms
``W``: with the chunk's entering state ``S`` in shared memory, one warpgroup computes ``K S``, then
``V - 2^G (K S)``, then one small GEMM with the inverse; the chain only adds ``K^T V'`` to ``S``.
The same arithmetic with kda's *gated* inverse ``Tb = T diag(b)`` (every factor ``2^x``, ``x <= 0``):

* chain (warpgroup 0): ``S`` to shared memory (bf16); ``S <- 2^G_last S + K^T V'`` once ``V'`` is
  there;
* warpgroup 1: ``X = V - 2^G (K S)`` (written over ``V``'s slot), ``V_new = Tb X`` to shared memory
  for the output, ``V' = 2^(G_last - G) V_new`` for the chain;
* warpgroup 2: ``P = causal(scale Q K^T 2^(G_i - G_j))``, ``O = scale 2^G (Q S) + P V_new``;
* one producer warp: ``q, k, v, Tb`` of the next chunk by TMA into the second of two slots.

The chain's path per chunk is three GEMMs (``K S``, ``Tb X``, ``K^T V'``) and two element-wise
steps; ``Q K^T`` and ``Q S`` run beside it. Kernel 1 is run 53's ``gdn_inverse``.

First call (the pass as above at 32, 64 and 128 value columns) and second call (the flags of
``VARIANTS`` at 32 and 128: ``2^G`` and ``2^(G_last - G)`` written once per row by the producer warp;
tilelang's fast math; ``G`` head-major so that it comes by TMA) write to the same ``run54.jsonl``.

* ``compile``: the variants for sm_90a, in parallel processes (registers, spills);
* ``check``: as run 53 (kda's GDN and the float64 recurrence; runs of -20; ragged tail; h0);
* ``time``: the pass at each width, with ``gdn_inverse``; FlashQLA's two kernels alone
  (``kkt_solve``, ``fused_gdr_fwd``) and its whole op with and without ``auto_cp``; kda's GDN.

    python results/tuning/run54-gdn-pass-from-ks.py compile check time
"""
import importlib.util
import os
import sys

import tilelang.language as T

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import log  # noqa: E402

RUN = "run54"
ACCUM = "float32"


def run53():
    spec = importlib.util.spec_from_file_location("run53", os.path.join(HERE, "run53-gdn-fused-pass.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gdn_pass_from_ks(DK, DV, chunk_size=64, block_dv=64, dtype="bfloat16", nreg=(160, 128, 128, 40),
                     exps_by_producer=False, g_head_major=False):
    """Arguments as run 53's ``gdn_pass``: ``Q, K [B, T, H, DK]``, ``V [B, T, H, DV]``, ``Tb [B, T,
    H, C]``, ``G [B, T, H]`` (float32, log2, chunk-local cumsum), ``scale``, ``h0``; outputs ``O``
    and ``ht``. Rows past ``T`` load as zeros and ``G`` there repeats the last row's.
    ``exps_by_producer``: the producer warp also writes ``2^G`` and ``2^(G_last - G)`` per row, so
    the consumers read them instead of computing an exponential per element. ``g_head_major``: ``G``
    is ``[B, H, TP]`` (``TP``: ``T`` rounded up to chunks, the last row repeated), so a chunk's 64
    values are contiguous and come by TMA with the rest."""
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        Tb: T.Tensor([B, S, H, C], dtype),
        G: T.Tensor([B, H, T.dynamic("TP")] if g_head_major else [B, S, H], ACCUM),
        scale: T.float32,
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=512) as (bv, bh, bb):
            dv0 = bv * BV
            q_s = T.alloc_shared([2, C, DK], dtype)          # two slots: chunk c in slot c % 2
            k_s = T.alloc_shared([2, C, DK], dtype)
            v_s = T.alloc_shared([2, C, BV], dtype)          # V, then X = V - 2^G K S
            tb_s = T.alloc_shared([2, C, C], dtype)
            G_s = T.alloc_shared([2, C], ACCUM)
            E_s = T.alloc_shared([2, C], ACCUM)             # 2^G (exps_by_producer)
            R_s = T.alloc_shared([2, C], ACCUM)             # 2^(G_last - G) (exps_by_producer)
            S_s = T.alloc_shared([DK, BV], dtype)
            vd_s = T.alloc_shared([C, BV], dtype)            # V_new, for the output
            vn_s = T.alloc_shared([C, BV], dtype)            # V' = 2^(G_last - G) V_new, for the chain
            p_s = T.alloc_shared([C, C], dtype)
            o_s = T.alloc_shared([C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            KS = T.alloc_fragment([C, BV], ACCUM)
            VD = T.alloc_fragment([C, BV], ACCUM)
            P_f = T.alloc_fragment([C, C], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[384, 384])     # the three warpgroups
            s_ready = T.alloc_barrier(arrive_count=128)              # chain -> warpgroups 1, 2
            s_free = T.alloc_barrier(arrive_count=256)               # warpgroups 1, 2 -> chain
            vn_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> chain
            vd_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> output
            vd_free = T.alloc_barrier(arrive_count=128)              # output -> warpgroup 1
            tx = T.get_thread_binding()
            # a wait for parity (c + 1) % 2 passes at c = 0 and then waits for chunk c - 1's arrival
            if tx < 128:                                             # the chain
                T.set_max_nreg(nreg[0], 1)
                T.copy(h0[bb, bh, :, dv0:dv0 + BV], S_f)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(s_free, (c + 1) % 2)
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    for i, j in T.Parallel(DK, BV):
                        if exps_by_producer:
                            S_f[i, j] = S_f[i, j] * E_s[slot, C - 1]
                        else:
                            S_f[i, j] = S_f[i, j] * T.exp2(G_s[slot, C - 1])
                    T.barrier_wait(vn_ready, c % 2)
                    T.gemm(k_s[slot, :, :], vn_s, S_f, transpose_A=True)
                    T.barrier_arrive(data_free[slot])
                T.copy(S_f, ht[bb, bh, :, dv0:dv0 + BV])
            elif tx < 256:                                           # V_new and V'
                T.set_max_nreg(nreg[1], 1)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(s_ready, c % 2)
                    T.gemm(k_s[slot, :, :], S_s, KS, clear_accum=True)
                    T.barrier_arrive(s_free)
                    for i, j in T.Parallel(C, BV):
                        if exps_by_producer:
                            v_s[slot, i, j] = v_s[slot, i, j] - E_s[slot, i] * KS[i, j]
                        else:
                            v_s[slot, i, j] = v_s[slot, i, j] - T.exp2(G_s[slot, i]) * KS[i, j]
                    T.fence_proxy_async()
                    T.gemm(tb_s[slot, :, :], v_s[slot, :, :], VD, clear_accum=True)
                    for i, j in T.Parallel(C, BV):
                        if exps_by_producer:
                            vn_s[i, j] = VD[i, j] * R_s[slot, i]
                        else:
                            vn_s[i, j] = VD[i, j] * T.exp2(G_s[slot, C - 1] - G_s[slot, i])
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    T.barrier_wait(vd_free, (c + 1) % 2)
                    T.copy(VD, vd_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(vd_ready)
                    T.barrier_arrive(data_free[slot])
            elif tx < 384:                                           # the output
                T.set_max_nreg(nreg[2], 1)
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
                        if exps_by_producer:
                            O_f[i, j] = O_f[i, j] * (scale * E_s[slot, i])
                        else:
                            O_f[i, j] = O_f[i, j] * (scale * T.exp2(G_s[slot, i]))
                    T.barrier_wait(vd_ready, c % 2)
                    T.gemm(p_s, vd_s, O_f)
                    T.barrier_arrive(vd_free)
                    T.barrier_arrive(data_free[slot])
                    T.copy(O_f, o_s)
                    T.copy(o_s, O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])
            else:                                                    # the producer warp
                T.set_max_nreg(nreg[3], 0)
                if tx < 416:
                    for c in T.serial(NC):
                        slot = c % 2
                        T.barrier_wait(data_free[slot], (c // 2 + 1) % 2)
                        rows = slice(c * C, (c + 1) * C)
                        T.tma_copy(Q[bb, rows, bh, :], q_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(K[bb, rows, bh, :], k_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], v_s[slot, :, :], barrier=data_ready[slot])
                        T.tma_copy(Tb[bb, rows, bh, :], tb_s[slot, :, :], barrier=data_ready[slot])
                        if g_head_major:
                            T.tma_copy(G[bb, bh, rows], G_s[slot, :], barrier=data_ready[slot])
                        for i in T.Parallel(C):
                            if not g_head_major:
                                G_s[slot, i] = G[bb, T.min(c * C + i, S - 1), bh]
                            if exps_by_producer:
                                E_s[slot, i] = T.exp2(G[bb, T.min(c * C + i, S - 1), bh])
                                R_s[slot, i] = T.exp2(G[bb, T.min(c * C + C - 1, S - 1), bh]
                                                      - G[bb, T.min(c * C + i, S - 1), bh])
                        T.barrier_arrive(data_ready[slot])

    return main


WIDTHS = (32, 64, 128)
# (value columns, exponentials by the producer, fast math): the flags measured in the second call
VARIANTS = ([(bv, e, f, False) for bv in (32, 128) for e in (False, True) for f in (False, True)]
            + [(bv, False, True, True) for bv in (32, 128)])
FAST_MATH = {"tl.enable_fast_math": True}


def compile_variant(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    bv, exps, fast, head_major = VARIANTS[i]
    row = {"what": "compile", "block_dv": bv, "exps_by_producer": exps, "fast_math": fast,
           "g_head_major": head_major}
    try:
        kernel = compile_program(gdn_pass_from_ks, (), target=SM90A, pass_configs=FAST_MATH if fast else None,
                                 DK=128, DV=128, block_dv=bv, exps_by_producer=exps,
                                 g_head_major=head_major)
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-600:]}


def compile_all():
    from harness import compile_in_processes
    compile_in_processes(RUN, len(VARIANTS), compile_variant)


def launch(q, k, v, Tb, G, scale, h0, block_dv, exps=False, fast=False, head_major=False):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = q.shape
    kernel = compile_program(gdn_pass_from_ks, (), pass_configs=FAST_MATH if fast else None, DK=D,
                             DV=v.shape[-1], block_dv=block_dv, exps_by_producer=exps, g_head_major=head_major)
    o = torch.full_like(v, float("nan"))
    ht = torch.full((B, H, D, v.shape[-1]), float("nan"), device=q.device)
    kernel(q, k, v, Tb, G, scale, h0, o, ht)
    return o, ht


def g_head_major_layout(G, C=64):
    """``G [B, T, H]`` as ``[B, H, TP]``, ``TP`` the chunks' rows, the last row repeated past ``T``."""
    import torch.nn.functional as F
    Tn = G.shape[1]
    pad = -Tn % C
    Gt = G.transpose(1, 2)
    return F.pad(Gt, (0, pad), mode="replicate").contiguous() if pad else Gt.contiguous()


def check(r53):
    import torch

    import kda
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    for shape, gate in [((2, 1000, 4, 128), "logsigmoid"), ((2, 1000, 4, 128), "runs_of_-20"),
                        ((1, 32768, 32, 128), "logsigmoid")]:
        B, Tn, H, D = shape
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=54)
        if gate == "runs_of_-20":
            g[:, 40:110] = -20.0
        h0 = torch.randn(B, H, D, D, device="cuda")
        Tb, G = r53.inverse_launch(k, g, beta)
        o_k, ht_k = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        small = Tn <= 1000
        if small:
            o_r, ht_r = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
        for bv, exps, fast, head_major in VARIANTS:
            flags = {"block_dv": bv, "exps_by_producer": exps, "fast_math": fast, "g_head_major": head_major}
            G_in = g_head_major_layout(G) if head_major else G
            try:
                o, ht = launch(q, k, v, Tb, G_in, D ** -0.5, h0, bv, exps, fast, head_major)
            except Exception as e:  # noqa: BLE001
                log(RUN, {"what": "check", "shape": list(shape), **flags, "error": repr(e)[-600:]})
                continue
            row = {"what": "check", "shape": list(shape), "gate": gate, **flags,
                   "nan": bool(o.isnan().any() or ht.isnan().any()),
                   "o_vs_kda": rel_l2(o, o_k), "ht_vs_kda": rel_l2(ht, ht_k)}
            if small:
                row.update(o_vs_float64=rel_l2(o, o_r), ht_vs_float64=rel_l2(ht, ht_r),
                           kda_o_vs_float64=rel_l2(o_k, o_r))
            log(RUN, row)


def time_all(r53):
    import torch

    import flash_qla
    import kda
    from flash_qla.ops.gated_delta_rule.chunk.hopper import fused_gdr_fwd, kkt_solve
    from flash_qla.ops.utils import chunk_local_cumsum
    from kda.bench import median_ms
    for B, Tn, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v, g, beta = r53.inputs(B, Tn, H, D, seed=5)
        h0 = torch.zeros(B, H, D, D, device="cuda")
        Tb, G = r53.inverse_launch(k, g, beta)
        base = {"what": "time", "shape": [B, Tn, H, D]}
        for bv, exps, fast, head_major in VARIANTS:
            flags = {"block_dv": bv, "exps_by_producer": exps, "fast_math": fast, "g_head_major": head_major}
            G_in = g_head_major_layout(G) if head_major else G
            try:
                log(RUN, {**base, "impl": "pass from KS", **flags,
                          "ms": median_ms(lambda: launch(q, k, v, Tb, G_in, D ** -0.5, h0, bv, exps, fast, head_major))})
            except Exception as e:  # noqa: BLE001
                log(RUN, {**base, "impl": "pass from KS", **flags, "error": repr(e)[-600:]})
        log(RUN, {**base, "impl": "gdn_inverse", "ms": median_ms(lambda: r53.inverse_launch(k, g, beta))})
        try:                                   # the inverse at 128 threads (4 blocks per SM fit)
            from kda.kernels.build import compile_program
            inv128 = compile_program(r53.gdn_inverse, (), DK=D, dtype="bfloat16", threads=128)
            G2 = torch.full_like(G, float("nan"))
            Tb2 = torch.full_like(Tb, float("nan"))
            args = (k, g[..., None].contiguous(), beta.float().contiguous(), G2, Tb2,
                    torch.zeros(2, dtype=torch.int32, device=k.device))
            inv128(*args)
            log(RUN, {**base, "impl": "gdn_inverse, 128 threads", "equal_to_256": bool(torch.equal(Tb2, Tb)),
                      "ms": median_ms(lambda: inv128(*args))})
        except Exception as e:  # noqa: BLE001
            log(RUN, {**base, "impl": "gdn_inverse, 128 threads", "error": repr(e)[-600:]})
        gc = chunk_local_cumsum(g=g, chunk_size=64)
        a = kkt_solve(k=k, b=beta, chunk_size=64)
        log(RUN, {**base, "impl": "FlashQLA chunk_local_cumsum", "ms": median_ms(
            lambda: chunk_local_cumsum(g=g, chunk_size=64))})
        log(RUN, {**base, "impl": "FlashQLA kkt_solve", "ms": median_ms(lambda: kkt_solve(k=k, b=beta, chunk_size=64))})
        log(RUN, {**base, "impl": "FlashQLA fused_gdr_fwd", "ms": median_ms(lambda: fused_gdr_fwd(
            q=q, k=k, v=v, a=a, g=gc, b=beta, scale=D ** -0.5, initial_state=h0, output_final_state=True))})
        for auto_cp in (False, True):
            log(RUN, {**base, "impl": f"FlashQLA chunk_gated_delta_rule, auto_cp={auto_cp}", "ms": median_ms(
                lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5, auto_cp=auto_cp))})
        log(RUN, {**base, "impl": "kda chunk_gated_delta_rule",
                  "ms": median_ms(lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta))})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    r53 = run53()
    if "compile" in steps:
        compile_all()
    if "check" in steps:
        check(r53)
    if "time" in steps:
        time_all(r53)
