"""Run 53 (H200, 2026-12-01): GDN's sequential pass reading the raw inputs, as FlashQLA's does.

kda's GDN (scalar gate) is ``chunk_intra``'s scalar path, which writes ``Qw, Kw, W, U`` (four
``[B, T, H, 128]`` bf16 tensors) and ``A_qk``, then the state pass reads them: about 3.5 GB at
(1, 32768, 32, 128), and 1.82 ms against FlashQLA's 0.68 (record of f69b7dd). FlashQLA writes only
a ``[B, T, H, 64]`` inverse and forms everything else inside its persistent pass, in warpgroups
beside the state's chain (results/tuning/README.md, after run 52).

This pass takes ``q, k, v`` as they are, ``Tb = T diag(b)`` (the *gated* inverse of the chunk,
``T = (I + strict(diag(b) (K K^T * 2^(G_i - G_j))))^-1``, bf16 ``[B, T, H, C]``) and ``G`` (the
chunk-local cumsum of the gate in log2 units, float32 ``[B, T, H]``). Every factor it forms is
``2^x`` with ``x <= 0``, so it stays exact for any gate (FlashQLA's ungated inverse needs
``2^-G``, which overflows where a chunk's gate falls by more than 2^127). Per chunk, 512 threads:

* warpgroup 1: ``K 2^G`` and ``Kw = K 2^(G_last - G)``, then ``W = Tb (K 2^G)`` and ``U = Tb V``
  (two GEMMs), to shared memory for the chain;
* warpgroup 0, the chain: ``S`` to shared memory, ``W S``, ``V_new = U - W S``,
  ``S <- 2^G_last S + Kw^T V_new`` (two GEMMs, as in the pass of record);
* warpgroup 2, the output: ``Qw = scale Q 2^G``, ``P = causal(scale Q K^T 2^(G_i - G_j))``, then
  ``O = Qw S + P V_new``;
* one producer warp: ``q, k, v, Tb`` of the next chunk by TMA into the second of two slots, ``G``
  by plain loads.

Kernel 1 (``gdn_inverse``) makes ``Tb`` and ``G`` from ``k, g, beta`` with level 5's stages (one
GEMM ``K K^T``, the decay where it is written, the solve); the check compares it with a float64
version in torch (``chunk_inputs``), and runs the pass on both.

* ``compile``: the pass for sm_90a (registers, spills), 32 and 64 value columns;
* ``check``: O and ht against ``kda.chunk_gated_delta_rule`` and the float64 recurrence at
  (2, 1000, 4, 128) with an initial state (ragged tail), and at (1, 32768, 32, 128);
* ``time``: the pass alone at both widths; kda's state pass on ``chunk_intra``'s output; kda's
  and FlashQLA's whole GDN at (1, 32768, 32, 128) and (1, 8192, 96, 128).

    python results/tuning/run53-gdn-fused-pass.py compile check time
"""
import os
import sys

import tilelang.language as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run53"
ACCUM = "float32"


def gdn_pass(DK, DV, chunk_size=64, block_dv=64, dtype="bfloat16"):
    """Arguments: ``Q, K [B, T, H, DK]``, ``V [B, T, H, DV]``, ``Tb [B, T, H, C]`` (dtype), ``G [B, T,
    H]`` (float32), ``scale``, ``h0 [B, H, DK, DV]`` (float32); outputs ``O [B, T, H, DV]`` (dtype)
    and ``ht [B, H, DK, DV]`` (float32). Rows past ``T`` are zeros (TMA fills them) and ``G`` there
    repeats the last row's, so the last chunk needs no mask."""
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
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=512) as (bv, bh, bb):
            dv0 = bv * BV
            q_s = T.alloc_shared([2, C, DK], dtype)          # two slots: chunk c in slot c % 2
            k_s = T.alloc_shared([2, C, DK], dtype)
            v_s = T.alloc_shared([2, C, BV], dtype)
            tb_s = T.alloc_shared([2, C, C], dtype)
            G_s = T.alloc_shared([2, C], ACCUM)
            kg_s = T.alloc_shared([C, DK], dtype)            # K 2^G (warpgroup 1's own)
            kw_s = T.alloc_shared([C, DK], dtype)            # K 2^(G_last - G), for the chain
            w_s = T.alloc_shared([C, DK], dtype)
            u_s = T.alloc_shared([C, BV], dtype)
            qw_s = T.alloc_shared([C, DK], dtype)            # warpgroup 2's own
            p_s = T.alloc_shared([C, C], dtype)
            S_s = T.alloc_shared([DK, BV], dtype)
            vn_s = T.alloc_shared([C, BV], dtype)
            o_s = T.alloc_shared([C, BV], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            WS = T.alloc_fragment([C, BV], ACCUM)
            W_f = T.alloc_fragment([C, DK], ACCUM)
            U_f = T.alloc_fragment([C, BV], ACCUM)
            A_f = T.alloc_fragment([C, C], ACCUM)
            O_f = T.alloc_fragment([C, BV], ACCUM)
            data_ready = T.alloc_barrier(arrive_count=[32, 32])      # the producer warp, + TMA bytes
            data_free = T.alloc_barrier(arrive_count=[384, 384])     # the three warpgroups
            wu_ready = T.alloc_barrier(arrive_count=128)             # warpgroup 1 -> chain
            wu_free = T.alloc_barrier(arrive_count=128)              # chain -> warpgroup 1
            s_ready = T.alloc_barrier(arrive_count=128)              # chain -> output
            s_free = T.alloc_barrier(arrive_count=128)               # output -> chain
            vn_ready = T.alloc_barrier(arrive_count=128)
            vn_free = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            # a wait for parity (c + 1) % 2 passes at c = 0 and then waits for chunk c - 1's arrival
            if tx < 128:                                             # the chain
                T.copy(h0[bb, bh, :, dv0:dv0 + BV], S_f)
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(s_free, (c + 1) % 2)
                    T.copy(S_f, S_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready)
                    T.barrier_wait(wu_ready, c % 2)
                    T.gemm(w_s, S_s, WS, clear_accum=True)
                    T.barrier_wait(vn_free, (c + 1) % 2)
                    for i, j in T.Parallel(C, BV):
                        vn_s[i, j] = u_s[i, j] - WS[i, j]
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_ready)
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    for i, j in T.Parallel(DK, BV):
                        S_f[i, j] = S_f[i, j] * T.exp2(G_s[slot, C - 1])
                    T.gemm(kw_s, vn_s, S_f, transpose_A=True)
                    T.barrier_arrive(wu_free)
                    T.barrier_arrive(data_free[slot])
                T.copy(S_f, ht[bb, bh, :, dv0:dv0 + BV])
            elif tx < 256:                                           # W and U
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.barrier_wait(wu_free, (c + 1) % 2)
                    for i, d in T.Parallel(C, DK):
                        kg_s[i, d] = k_s[slot, i, d] * T.exp2(G_s[slot, i])
                        kw_s[i, d] = k_s[slot, i, d] * T.exp2(G_s[slot, C - 1] - G_s[slot, i])
                    T.fence_proxy_async()
                    T.gemm(tb_s[slot, :, :], kg_s, W_f, clear_accum=True)
                    T.gemm(tb_s[slot, :, :], v_s[slot, :, :], U_f, clear_accum=True)
                    T.copy(W_f, w_s)
                    T.copy(U_f, u_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(wu_ready)
                    T.barrier_arrive(data_free[slot])
            elif tx < 384:                                           # the output
                for c in T.serial(NC):
                    slot = c % 2
                    T.barrier_wait(data_ready[slot], (c // 2) % 2)
                    T.gemm(q_s[slot, :, :], k_s[slot, :, :], A_f, transpose_B=True, clear_accum=True)
                    for i, d in T.Parallel(C, DK):
                        qw_s[i, d] = q_s[slot, i, d] * (scale * T.exp2(G_s[slot, i]))
                    for i, j in T.Parallel(C, C):
                        p_s[i, j] = T.if_then_else(
                            j <= i, A_f[i, j] * scale * T.exp2(T.min(G_s[slot, i] - G_s[slot, j], 0.0)), 0.0)
                    T.fence_proxy_async()
                    T.barrier_wait(s_ready, c % 2)
                    T.gemm(qw_s, S_s, O_f, clear_accum=True)
                    T.barrier_arrive(s_free)
                    T.barrier_wait(vn_ready, c % 2)
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
                    for i in T.Parallel(C):
                        G_s[slot, i] = G[bb, T.min(c * C + i, S - 1), bh]
                    T.barrier_arrive(data_ready[slot])

    return main


def gdn_inverse(DK, chunk_size=64, dtype="bfloat16", threads=256):
    """Kernel 1 of the pair, every chunk at once: the gate's cumsum ``G`` (log2, float32 ``[B, T,
    H]``) and ``Tb = T diag(b)`` (dtype ``[B, T, H, C]``) from ``K [B, T, H, DK]``, ``g [B, T, H,
    1]`` and ``beta [B, T, H]`` (float32), with level 5's stages: one GEMM ``K K^T``, the decay
    ``2^(G_i - G_j)`` where it is written (``<= 1``), the diagonal blocks by columns and the merge by
    substitution. Last argument ``flags [2]`` (int32, as ``chunk_intra``)."""
    from kda.kernels.level5 import SOLVE_BLOCK, invert_diagonal_blocks_by_columns, log2_cumsum_by_columns
    from kda.kernels.stages import decay_factor, merge_by_substitution

    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C = chunk_size
    NC = T.ceildiv(S, C)

    @T.prim_func
    def main(
        K: T.Tensor([B, S, H, DK], dtype),
        g: T.Tensor([B, S, H, 1], ACCUM),
        beta: T.Tensor([B, S, H], ACCUM),
        G: T.Tensor([B, S, H], ACCUM),
        Tb: T.Tensor([B, S, H, C], dtype),
        flags: T.Tensor([2], "int32"),
    ):
        with T.Kernel(NC, H, B, threads=threads) as (c, bh, bb):
            T.annotate_min_blocks_per_sm(2)
            t0 = c * C
            L = T.min(C, S - t0)
            K_s = T.alloc_shared([C, DK], dtype)
            G_s = T.alloc_shared([C, 1], ACCUM)
            beta_s = T.alloc_shared([C], ACCUM)
            A = T.alloc_fragment([C, C], ACCUM)
            A_s = T.alloc_shared([C, C], ACCUM)
            Tinv_s = T.alloc_shared([C, C], ACCUM)
            Tb_s = T.alloc_shared([C, C], dtype)
            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            T.copy(K[bb, t0:t0 + C, bh, :], K_s)
            T.copy(g[bb, t0:t0 + C, bh, :], G_s)
            log2_cumsum_by_columns(G_s, G_s, L, C, 1, flags)
            for i in T.Parallel(C):
                beta_s[i] = T.if_then_else(i < L, beta[bb, t0 + T.min(i, L - 1), bh], 0.0)
            T.gemm(K_s, K_s, A, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                A_s[i, j] = T.if_then_else(j < i, A[i, j] * beta_s[i] * decay_factor(G_s[i, 0] - G_s[j, 0]), 0.0)
            invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)
            merge_by_substitution(A_s, Tinv_s, C, SOLVE_BLOCK)
            for i, j in T.Parallel(C, C):     # blocks above the diagonal are not written: read as 0
                Tb_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j] * beta_s[j], 0.0)
            for i, j in T.Parallel(C, C):
                if i < L:
                    Tb[bb, t0 + i, bh, j] = Tb_s[i, j]
            for i in T.Parallel(C):
                if i < L:
                    G[bb, t0 + i, bh] = G_s[i, 0]

    return main


def inverse_launch(k, g, beta):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = k.shape
    kernel = compile_program(gdn_inverse, (), DK=D, dtype="bfloat16")
    G = torch.full((B, Tn, H), float("nan"), device=k.device)
    Tb = torch.full((B, Tn, H, 64), float("nan"), dtype=k.dtype, device=k.device)
    kernel(k, g[..., None].contiguous(), beta.float().contiguous(), G, Tb, torch.zeros(2, dtype=torch.int32,
                                                                                       device=k.device))
    return Tb, G


def chunk_inputs(q, k, g, beta, C=64):
    """``Tb = T diag(b)`` (in the dtype of ``q``) and ``G`` (float32, log2) of every chunk, in
    float64 with torch: what ``gdn_inverse`` computes, to check it and to run the pass on."""
    import math

    import torch

    from kda.reference.common import from_chunks, to_chunks

    Tn = k.shape[1]
    kc = to_chunks(k.double(), C)                                          # [B, H, NC, C, D]
    gc, bc = (to_chunks(x.double()[..., None], C)[..., 0] for x in (g, beta))    # [B, H, NC, C]
    Gc = gc.cumsum(-1) / math.log(2.0)
    decay = torch.exp2((Gc[..., :, None] - Gc[..., None, :]).clamp(max=0))
    A = torch.tril(bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay, -1)
    eye = torch.eye(C, dtype=torch.float64, device=k.device)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False)
    Tb = from_chunks(Tm * bc[..., None, :], Tn)
    G = from_chunks(Gc[..., None], Tn)[..., 0]
    return Tb.to(q.dtype).contiguous(), G.float().contiguous()


def compile_all():
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    try:
        log(RUN, {"what": "compile", "kernel": "gdn_inverse",
                  **ptxas_report(compile_program(gdn_inverse, (), target=SM90A, DK=128))})
    except Exception as e:  # noqa: BLE001
        log(RUN, {"what": "compile", "kernel": "gdn_inverse", "error": repr(e)[-600:]})
    for bv in (32, 64):
        try:
            kernel = compile_program(gdn_pass, (), target=SM90A, DK=128, DV=128, block_dv=bv)
            log(RUN, {"what": "compile", "block_dv": bv, **ptxas_report(kernel)})
        except Exception as e:  # noqa: BLE001
            log(RUN, {"what": "compile", "block_dv": bv, "error": repr(e)[-600:]})


def launch(q, k, v, Tb, G, scale, h0, block_dv):
    import torch

    from kda.kernels.build import compile_program
    B, Tn, H, D = q.shape
    kernel = compile_program(gdn_pass, (), DK=D, DV=v.shape[-1], block_dv=block_dv)
    o = torch.full_like(v, float("nan"))
    ht = torch.full((B, H, D, v.shape[-1]), float("nan"), device=q.device)
    kernel(q, k, v, Tb, G, scale, h0, o, ht)
    return o, ht


def inputs(B, Tn, H, D, seed):
    import torch

    from kda.reference import level4 as ref4
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, Tn, H, D, generator=gen, device="cuda") for _ in range(3))
    q, v = q.bfloat16(), v.bfloat16()
    k = ref4.l2_normalize(k).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, Tn, H, generator=gen, device="cuda"))
    beta = torch.rand(B, Tn, H, generator=gen, device="cuda")
    return q, k, v, g, beta


def check():
    import torch

    import kda
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    for shape, gate in [((2, 1000, 4, 128), "logsigmoid"), ((2, 1000, 4, 128), "runs_of_-20"),
                        ((1, 32768, 32, 128), "logsigmoid")]:
        B, Tn, H, D = shape
        q, k, v, g, beta = inputs(B, Tn, H, D, seed=53)
        if gate == "runs_of_-20":
            g[:, 40:110] = -20.0
        h0 = torch.randn(B, H, D, D, device="cuda")
        Tb, G = chunk_inputs(q, k, g, beta)
        Tb_k, G_k = inverse_launch(k, g, beta)
        log(RUN, {"what": "check", "kernel": "gdn_inverse", "shape": list(shape), "gate": gate,
                  "nan": bool(Tb_k.isnan().any() or G_k.isnan().any()),
                  "Tb_vs_float64": rel_l2(Tb_k, Tb), "G_vs_float64": rel_l2(G_k, G)})
        o_k, ht_k = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        small = Tn <= 1000
        if small:
            o_r, ht_r = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
        for bv, (Tb_in, G_in) in [(32, (Tb, G)), (64, (Tb, G)), (32, (Tb_k, G_k))]:
            o, ht = launch(q, k, v, Tb_in, G_in, D ** -0.5, h0, bv)
            row = {"what": "check", "shape": list(shape), "gate": gate, "block_dv": bv,
                   "inverse": "gdn_inverse" if Tb_in is Tb_k else "torch float64",
                   "nan": bool(o.isnan().any() or ht.isnan().any()),
                   "o_vs_kda": rel_l2(o, o_k), "ht_vs_kda": rel_l2(ht, ht_k)}
            if small:
                row.update(o_vs_float64=rel_l2(o, o_r), ht_vs_float64=rel_l2(ht, ht_r),
                           kda_o_vs_float64=rel_l2(o_k, o_r))
            log(RUN, row)


def time_all():
    import torch

    import flash_qla
    import kda
    from kda.bench import median_ms
    from kda.gated_delta import prepare_chunks, run_state_pass
    for B, Tn, H, D in [(1, 32768, 32, 128), (1, 8192, 96, 128)]:
        q, k, v, g, beta = inputs(B, Tn, H, D, seed=5)
        Tb, G = chunk_inputs(q, k, g, beta)
        h0 = torch.zeros(B, H, D, D, device="cuda")
        form = prepare_chunks(q, k, v, g[..., None].contiguous(), beta, D ** -0.5)
        base = {"what": "time", "shape": [B, Tn, H, D]}
        for bv in (32, 64):
            log(RUN, {**base, "impl": f"gdn_pass, {bv} columns",
                      "ms": median_ms(lambda: launch(q, k, v, Tb, G, D ** -0.5, h0, bv))})
        log(RUN, {**base, "impl": "gdn_inverse", "ms": median_ms(lambda: inverse_launch(k, g, beta))})
        for bv in (32, 64):
            log(RUN, {**base, "impl": f"gdn_inverse + gdn_pass, {bv} columns", "ms": median_ms(
                lambda: launch(q, k, v, *inverse_launch(k, g, beta), D ** -0.5, h0, bv))})
        log(RUN, {**base, "impl": "kda state pass on chunk_intra's output", "ms": median_ms(lambda: run_state_pass(form, None))})
        log(RUN, {**base, "impl": "kda chunk_intra, scalar path", "ms": median_ms(
            lambda: prepare_chunks(q, k, v, g[..., None].contiguous(), beta, D ** -0.5))})
        log(RUN, {**base, "impl": "kda chunk_gated_delta_rule",
                  "ms": median_ms(lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta))})
        log(RUN, {**base, "impl": "FlashQLA chunk_gated_delta_rule", "ms": median_ms(
            lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5))})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    if "compile" in steps:
        compile_all()
    if "check" in steps:
        check()
    if "time" in steps:
        time_all()
