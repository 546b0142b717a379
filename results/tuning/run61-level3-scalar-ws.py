"""Run 61 (H200): level 3's scalar-gate pass warp-specialised by hand, as level 5's state pass.

Run 60 showed the scalar pass (``kda.kernels.level3.seq_in_loop_scalar``, 0.691 ms at (1, 32768,
32, 128), level 2's loop with the weights made per chunk) is not limited by its ``exp2``: moving the
weights into ``[C]`` vectors in shared memory made it slower (0.73 to 0.76 ms), the barriers they
need being on the chain. The chain is the whole chunk: one warpgroup issues the four GEMMs and the
weights of a chunk before the next chunk's state exists. Here the work is split as in level 5's
``gated_state_output_pass`` (run 39: 0.721 -> 0.607 ms there):

* warpgroup 0, the state's chain: ``S`` to shared memory (``S_s``, two slots so that the chain can
  run a chunk ahead of the output), ``S <- 2^G_last S + K^T (V 2^(G_last - G))``;
* ``out_groups`` output warpgroups (1 or 2; with 2 they take alternate chunks): ``A = Q K^T`` and its
  decay ``2^(G_i - G_j)`` before the chunk's state is needed, then ``Q S_s`` times ``scale 2^G_i``,
  ``+ A V``, the store;
* one producer warp loading ``slots`` chunk slots (q, k, the value columns, the chunk's ``G``) by TMA.

The arithmetic is the pass of record's, element for element, so the outputs should be bit-identical
(the check says). ``A`` reaches the last GEMM through registers (``score_operand="registers"``) or
through shared memory (``"shared"``), since tilelang's layout inference failed on the register form
in a 256-thread kernel before (run 57).

    python results/tuning/run61-level3-scalar-ws.py compile     # then each variant in its own process

Call 3 also times each pass on level 2's workload (``time_level2``).

Calls 1 and 2 (2026-12-01): with one output warpgroup (2 and 3 slots) the outputs and final states
are bit-identical to the pass of record (first check shape). Two output warpgroups failed: with the
scores in registers tilelang 0.1.15's layout inference refuses a fragment shared by 256 output
threads (``A`` against ``A_cast``); with the scores through shared memory the kernel compiled and
hung in its first check, and call 2 timed out there, before any timing. Both output warpgroups ran
one code branch with one set of fragments, so every barrier tilelang inserts in it spans both
(whether that caused the hang is not established). Now each output warpgroup has its own branch
and fragments (the generated code shows named barriers 4 and 5, 128 threads each), and each
variant runs in its own process with a time limit.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, each_in_process, log  # noqa: E402
from harness import scalar_gates as gates  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run61"


def scalar_pass_ws(DK, DV, chunk_size=64, block_dv=32, dtype="bfloat16", slots=2, out_groups=1,
                   score_operand="registers", initial_state=False, final_state=False):
    """Arguments at run time: ``Q, K, V, G [B, H, T_pad]`` (``chunk_cumsum``), ``scale``, ``h0``,
    then ``O``, ``ht`` (``h0``/``ht`` stand-ins ``[1, 1, DK, DV]`` without the flags)."""
    import tilelang.language as T

    from kda.kernels.stages import ACCUM, decay_factor
    B, S, H = T.dynamic("B"), T.dynamic("T"), T.dynamic("H")
    C, BV = chunk_size, block_dv
    NC = T.ceildiv(S, C)
    threads = 128 * (1 + out_groups) + 128          # the producer warp's warpgroup, mostly idle
    h0_shape = [B, H, DK, DV] if initial_state else [1, 1, DK, DV]
    ht_shape = [B, H, DK, DV] if final_state else [1, 1, DK, DV]

    @T.macro
    def output_chunks(w, Q_s, K_s, V_s, G_s, S_s, O_s, A_s, acc_o, A, A_cast, data_ready, data_free, s_ready,
                      s_free, scale, O, bb, bh, dv0):
        """Output warpgroup ``w``: chunks ``c = w mod out_groups``."""
        for cc in T.serial(T.ceildiv(NC - w, out_groups)):
            c = cc * out_groups + w
            slot = c % slots
            T.barrier_wait(data_ready[slot], (c // slots) % 2)
            T.gemm(Q_s[slot, :, :], K_s[slot, :, :], A, transpose_B=True, clear_accum=True)
            for i, j in T.Parallel(C, C):
                A[i, j] = A[i, j] * decay_factor(G_s[slot, i] - G_s[slot, j]) * T.if_then_else(j <= i, scale, 0.0)
            if score_operand == "registers":
                T.copy(A, A_cast)
            else:
                T.copy(A, A_s[w, :, :])
                T.fence_proxy_async()
            T.barrier_wait(s_ready[c % 2], (c // 2) % 2)
            T.gemm(Q_s[slot, :, :], S_s[c % 2, :, :], acc_o, clear_accum=True)
            T.barrier_arrive(s_free[c % 2])
            for i, j in T.Parallel(C, BV):
                acc_o[i, j] = acc_o[i, j] * (scale * T.exp2(G_s[slot, i]))
            if score_operand == "registers":
                T.gemm(A_cast, V_s[slot, :, :], acc_o)
            else:
                T.gemm(A_s[w, :, :], V_s[slot, :, :], acc_o)
            T.barrier_arrive(data_free[slot])
            T.copy(acc_o, O_s[w, :, :])
            T.copy(O_s[w, :, :], O[bb, c * C:(c + 1) * C, bh, dv0:dv0 + BV])

    @T.prim_func
    def main(
        Q: T.Tensor([B, S, H, DK], dtype),
        K: T.Tensor([B, S, H, DK], dtype),
        V: T.Tensor([B, S, H, DV], dtype),
        G: T.Tensor([B, H, T.ceildiv(S, C) * C], ACCUM),
        scale: T.float32,
        h0: T.Tensor(h0_shape, ACCUM),
        O: T.Tensor([B, S, H, DV], dtype),
        ht: T.Tensor(ht_shape, ACCUM),
    ):
        with T.Kernel(T.ceildiv(DV, BV), H, B, threads=threads) as (bv, bh, bb):
            dv0 = bv * BV
            Q_s = T.alloc_shared([slots, C, DK], dtype)
            K_s = T.alloc_shared([slots, C, DK], dtype)
            V_s = T.alloc_shared([slots, C, BV], dtype)
            G_s = T.alloc_shared([slots, C], ACCUM)
            S_s = T.alloc_shared([2, DK, BV], dtype)
            Vw_s = T.alloc_shared([C, BV], dtype)
            O_s = T.alloc_shared([out_groups, C, BV], dtype)
            A_s = T.alloc_shared([out_groups, C, C], dtype)
            S_f = T.alloc_fragment([DK, BV], ACCUM)
            acc_o = T.alloc_fragment([C, BV], ACCUM)
            A = T.alloc_fragment([C, C], ACCUM)
            A_cast = T.alloc_fragment([C, C], dtype)
            acc_o_1 = T.alloc_fragment([C, BV], ACCUM)      # the second output warpgroup's
            A_1 = T.alloc_fragment([C, C], ACCUM)
            A_cast_1 = T.alloc_fragment([C, C], dtype)
            data_ready = T.alloc_barrier(arrive_count=[32] * slots)
            data_free = T.alloc_barrier(arrive_count=[256] * slots)
            s_ready = T.alloc_barrier(arrive_count=[128, 128])
            s_free = T.alloc_barrier(arrive_count=[128, 128])
            g_last = T.alloc_local([1], ACCUM)
            tx = T.get_thread_binding()
            if tx < 128:                                        # the state's chain
                if initial_state:
                    T.copy(h0[bb, bh, :, dv0:dv0 + BV], S_f)
                else:
                    T.clear(S_f)
                for c in T.serial(NC):
                    slot = c % slots
                    L = T.min(C, S - c * C)
                    T.barrier_wait(data_ready[slot], (c // slots) % 2)
                    T.barrier_wait(s_free[c % 2], (c // 2 + 1) % 2)       # chunk c - 2 read S_s
                    T.copy(S_f, S_s[c % 2, :, :])
                    T.fence_proxy_async()
                    T.barrier_arrive(s_ready[c % 2])
                    g_last[0] = G_s[slot, L - 1]
                    for i, j in T.Parallel(DK, BV):
                        S_f[i, j] = S_f[i, j] * T.exp2(g_last[0])
                    for r, j in T.Parallel(C, BV):                 # rows past L are zeros as loaded
                        Vw_s[r, j] = V_s[slot, r, j] * T.exp2(T.min(g_last[0] - G_s[slot, r], 0.0))
                    T.fence_proxy_async()
                    T.gemm(K_s[slot, :, :], Vw_s, S_f, transpose_A=True)
                    T.barrier_arrive(data_free[slot])
                if final_state:
                    T.copy(S_f, ht[bb, bh, :, dv0:dv0 + BV])
            # one code branch and one set of fragments per output warpgroup: the barriers tilelang
            # adds inside a branch, and a fragment's layout, belong to one warpgroup's threads
            if tx >= 128 and tx < 256:
                output_chunks(0, Q_s, K_s, V_s, G_s, S_s, O_s, A_s, acc_o, A, A_cast, data_ready,
                              data_free, s_ready, s_free, scale, O, bb, bh, dv0)
            if out_groups > 1:
                if tx >= 256 and tx < 384:
                    output_chunks(1, Q_s, K_s, V_s, G_s, S_s, O_s, A_s, acc_o_1, A_1, A_cast_1, data_ready,
                                  data_free, s_ready, s_free, scale, O, bb, bh, dv0)
            if tx >= 128 * (1 + out_groups) and tx < 128 * (1 + out_groups) + 32:   # the producer warp
                for c in T.serial(NC):
                    slot = c % slots
                    T.barrier_wait(data_free[slot], (c // slots + 1) % 2)
                    rows = slice(c * C, (c + 1) * C)
                    T.tma_copy(Q[bb, rows, bh, :], Q_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(K[bb, rows, bh, :], K_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(V[bb, rows, bh, dv0:dv0 + BV], V_s[slot, :, :], barrier=data_ready[slot])
                    T.tma_copy(G[bb, bh, rows], G_s[slot, :], barrier=data_ready[slot])
                    T.barrier_arrive(data_ready[slot])

    return main


VARIANTS = {
    "ws, 1 output group, 2 slots": dict(slots=2, out_groups=1),
    "ws, 1 output group, 3 slots": dict(slots=3, out_groups=1),
    "ws, 2 output groups, 2 slots": dict(slots=2, out_groups=2),
    "ws, 2 output groups, 4 slots": dict(slots=4, out_groups=2),
    "ws, 1 output group, 2 slots, scores by shared": dict(slots=2, out_groups=1, score_operand="shared"),
    "ws, 2 output groups, 2 slots, scores by shared": dict(slots=2, out_groups=2, score_operand="shared"),
}
NAMES = list(VARIANTS)


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name = NAMES[i % len(NAMES)]
    states = i >= len(NAMES)
    row = {"what": "compile", "variant": name, "states": states}
    try:
        kernel = compile_program(scalar_pass_ws, (), target=SM90A, DK=128, DV=128, dtype="bfloat16",
                                 initial_state=states, final_state=states, **VARIANTS[name])
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-800:]}


def built(name, states):
    from kda.kernels.build import compile_program
    return compile_program(scalar_pass_ws, (), DK=128, DV=128, dtype="bfloat16", initial_state=states,
                           final_state=states, **VARIANTS[name])


def record_kernels(states):
    """The cumsum and the pass of record, called alike under both kernel APIs: ``main``'s of calls
    1 and 2 (``with_state``, no flags) and the one of branch ``next-bundle`` (state flags with
    stand-ins, the cumsum's ``flags``): ``cumsum(g, G)``, ``record(q, k, v, G, scale, h0, o, ht)``."""
    import inspect

    import torch

    from kda.kernels import level3
    from kda.kernels.build import compile_program
    cumsum = compile_program(level3.chunk_cumsum, (), D=1, chunk_size=64, gate_dtype="float32")
    if "with_state" in inspect.signature(level3.seq_in_loop_scalar).parameters:
        seq = compile_program(level3.seq_in_loop_scalar, (), DK=128, DV=128, dtype="bfloat16", with_state=states)
        return cumsum, (seq if states else lambda q, k, v, G, scale, h0, o, ht: seq(q, k, v, G, scale, o))
    seq = compile_program(level3.seq_in_loop_scalar, (), DK=128, DV=128, dtype="bfloat16", initial_state=states,
                          final_state=states)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    return (lambda g, G: cumsum(g, G, flags)), seq


def check(names):
    """Each of ``names`` against the float64 reference and bit for bit against the pass of record."""
    import torch

    from kda.bench import random_qkv
    from kda.metrics import rel_l2
    from kda.reference import level3 as ref3
    cumsum, record = record_kernels(True)
    for (B, T, H, D), kind in [((2, 1000 + 37, 4, 128), "logsigmoid"), ((2, 1000 + 37, 4, 128), "runs of -20"),
                               ((1, 64 * 7, 3, 128), "logsigmoid"), ((1, 64 * 7 + 1, 3, 128), "logsigmoid")]:
        q, k, v = random_qkv(B, T, H, D, D, seed=61)
        h0 = torch.randn(B, H, D, D, device="cuda")
        g = gates(B, T, H, kind, seed=62)
        G = torch.empty(B, H, -(-T // 64) * 64, device="cuda")
        cumsum(g.view(B, T, H, 1), G.view(*G.shape, 1))
        o_ref, ht_ref = ref3.chunked(q.double() * D ** -0.5, k.double(), v.double(), g.double(), 64, h0.double(),
                                     True)
        o0, ht0 = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        record(q, k, v, G, D ** -0.5, h0, o0, ht0)
        for name in names:
            if name == "of record":
                o, ht = o0, ht0
            else:
                o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
                built(name, True)(q, k, v, G, D ** -0.5, h0, o, ht)
            torch.cuda.synchronize()
            log(RUN, {"what": "check", "variant": name, "gates": kind, "shape": [B, T, H, D],
                      "nan": bool(o.isnan().any() or ht.isnan().any()), "o_rel": rel_l2(o, o_ref),
                      "ht_rel": rel_l2(ht, ht_ref), "o_equal_to_record": bool(torch.equal(o, o0)),
                      "ht_equal_to_record": bool(torch.equal(ht, ht0))})


def time_all(names):
    """The op of record (checked and not), fla, the pass of record and each of ``names``' pass."""
    import torch
    from fla.ops.simple_gla import chunk_simple_gla

    from kda.bench import median_ms, random_qkv
    from kda.gated import gated_attention
    H, D = 32, 128
    scale = D ** -0.5
    cumsum, record = record_kernels(False)
    passes = {name: built(name, False) for name in names if name != "of record"}
    stand_in = torch.zeros(1, 1, D, D, device="cuda")
    for T in (8192, 32768):
        q, k, v = random_qkv(1, T, H, D, D, seed=T)
        g = gates(1, T, H, "logsigmoid", seed=T + 1)
        G = torch.empty(1, H, T, device="cuda")
        cumsum(g.view(1, T, H, 1), G.view(*G.shape, 1))
        o = torch.empty_like(v)
        rows = {}
        if "of record" in names:
            rows = {"kda op, checked": lambda: gated_attention(q, k, v, g),
                    "kda op, check_values=False": lambda: gated_attention(q, k, v, g, check_values=False),
                    "fla chunk_simple_gla(g)": lambda: chunk_simple_gla(q, k, v, g=g, scale=scale)[0],
                    "of record: pass": lambda: record(q, k, v, G, scale, stand_in, o, stand_in)}
        for name, kern in passes.items():
            rows[f"{name}: pass"] = lambda kern=kern: kern(q, k, v, G, scale, stand_in, o, stand_in)
        for label, fn in rows.items():
            log(RUN, {"what": "time", "T": T, "variant": label, "ms": median_ms(fn)})


def time_level2(name):
    """Level 2's workload (RetNet's per-head decays, T = 32768, H = 32): ``name``'s pass fed the
    chunk-local cumsum of the constant gate, ``G = log2(a) (t mod C + 1)``, beside level 2's kernel of
    record and fla's ``chunk_simple_gla(g_gamma)`` (the ``of record`` process times those two). Is the
    split worth a level-2 kernel of its own (level 2 is at 1.49x fla, the goal 1.5x)?"""
    import inspect

    import torch

    from kda.bench import fla_decay_attention, median_ms, random_qkv
    from kda.kernels import level2
    from kda.kernels.build import compile_program
    H, D, T, C = 32, 128, 32768, 64
    q, k, v = random_qkv(1, T, H, D, D, seed=T)
    alpha = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    log2_alpha = torch.log2(alpha).float().cuda()
    G = (log2_alpha.view(1, H, 1) * (torch.arange(T, device="cuda") % C + 1).view(1, 1, T)).contiguous()
    g_gamma = torch.log(alpha).float().cuda()                  # fla's form of the same decays
    o = torch.empty_like(v)
    stand_in = torch.zeros(1, 1, D, D, device="cuda")
    if name == "of record":
        kernel = compile_program(level2.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16")
        if "with_state" in inspect.signature(level2.seq_in_loop).parameters:
            record = lambda: kernel(q, k, v, log2_alpha, D ** -0.5, o)
        else:
            record = lambda: kernel(q, k, v, log2_alpha, D ** -0.5, stand_in, o, stand_in)
        rows = {"level 2 of record: pass": record,
                "fla chunk_simple_gla(g_gamma)": lambda: fla_decay_attention(q, k, v, g_gamma, D ** -0.5)}
    else:
        kern = built(name, False)
        rows = {f"{name}: pass on level 2's gates": lambda: kern(q, k, v, G, D ** -0.5, stand_in, o, stand_in)}
    for label, fn in rows.items():
        log(RUN, {"what": "time level 2", "T": T, "variant": label, "ms": median_ms(fn)})


def check_and_time(name):
    check([name])
    time_all([name])
    time_level2(name)


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_in_processes(RUN, 2 * len(NAMES), compile_one)
    each_in_process(RUN, ["of record"] + NAMES, check_and_time, limit_s=90)
