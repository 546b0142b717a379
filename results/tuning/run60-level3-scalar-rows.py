"""Run 60 (H200): level 3's scalar-gate pass with its weights made once per chunk, and the
gate check inside the cumsum kernel.

Level 3 scalar (``kda.gated_attention`` with ``g [B, T, H]``) takes 0.794 ms at (1, 32768, 32, 128)
against fla's ``chunk_simple_gla(g)`` 0.885 (1.11x; the record of 221fa65); the goal (#16) is 1.5x,
0.59 ms. Its stages: ``validate.check_gates`` 0.034 ms plus a read-back, ``chunk_cumsum`` 0.016,
``seq_in_loop_scalar`` 0.696. Level 2's pass, the same loop with a constant decay, takes 0.521: the
difference is the weights, which the scalar pass computes per element and per chunk (``exp2`` of
``G_i - G_j`` for all ``C x C`` scores, of ``G_last - G_r`` for every element of ``V``, of ``G_last``
for every element of the state), all of it on the chain from one chunk to the next. Run 2 measured
4096 ``exp2`` at about 250 of level 2's 1900 cycles per chunk.

Variants of ``kda/kernels/level3.py``, each built from its source:

* ``rows``: per chunk, four ``[C]`` vectors in shared memory (query weights ``scale 2^G_i``, key
  weights ``2^(G_last - G_r)``, and ``u_i = scale 2^(G_i - G_m)``, ``w_j = 2^(G_m - G_j)`` about the
  middle row ``m``), the state decay ``2^G_last`` once in a register; the scores' decay is
  ``u_i w_j`` (two multiplies, no ``exp2``) when the gate falls by at most ``DIAGONAL_SPAN_MAX``
  (96, log2 units) on either side of ``m``, so that both factors stay normal numbers, else the
  pairwise ``exp2`` as of record (runs of -20 take that branch);
* ``rows, pairwise scores``: the vectors and the state decay, the scores as of record;
* ``rows, factored scores only``: ``rows`` without the pairwise branch, for timing (wrong for
  steep gates, and its check says so);
* ``chunk_cumsum`` with a ``flags`` output: level 5's ``log2_cumsum_by_columns`` (a gate that is not
  finite and ``<= 0`` sets ``flags[0]``), so that the checked op reads one flag back between its two
  kernels instead of the min and max of ``g`` before them.

Checks against the float64 chunked reference (``kda.reference.level3``) at (2, 1000 + 37, 4, 128)
with an initial state, logsigmoid gates and gates with runs of -20; every output poisoned with NaN
first. Then, at T = 8192 and 32768 (H = 32, D = 128, bf16), side by side with fla: the op as of
record (checked and not), each variant's pass alone, and each variant as the op would run it
(cumsum with flags, the read-back, the pass; and without the read-back).

    python results/tuning/run60-level3-scalar-rows.py compile check time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, log, variant_module  # noqa: E402
from harness import scalar_gates as gates  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run60"
PATH = "kda/kernels/level3.py"

IMPORTS = ("""from kda.kernels.stages import ACCUM, LOG2_E, decay_factor, real""",
           """from kda.kernels.stages import ACCUM, DIAGONAL_SPAN_MAX, LOG2_E, decay_factor, real
from kda.kernels.level5 import log2_cumsum_by_columns""")
CUMSUM_FLAGS = [
    ("""    def main(g: T.Tensor([B, S, H, D], gate_dtype), G: T.Tensor([B, H, T.ceildiv(S, C) * C, D], ACCUM)):""",
     """    def main(g: T.Tensor([B, S, H, D], gate_dtype), G: T.Tensor([B, H, T.ceildiv(S, C) * C, D], ACCUM),
             flags: T.Tensor([2], "int32")):"""),
    ("""            gates_to_log2_cumsum(g_s, G_s, T.min(C, S - c * C), C, D)""",
     """            log2_cumsum_by_columns(g_s, G_s, T.min(C, S - c * C), C, D, flags)"""),
]
VECTORS = ("""        g_last = T.alloc_local([1], ACCUM)
""", """        g_last = T.alloc_local([1], ACCUM)
        g_mid = T.alloc_local([1], ACCUM)
        state_decay = T.alloc_local([1], ACCUM)
        w_key = T.alloc_shared([C], ACCUM)
        u_s = T.alloc_shared([C], ACCUM)
        w_s = T.alloc_shared([C], ACCUM)
""")
WEIGHTS_OF_RECORD = """            g_last[0] = G_s[L - 1]
            for i in T.Parallel(C):
                w_query[i] = scale * T.exp2(G_s[i])
            for i, j in T.Parallel(DK, block_dv):          # S = 2^G_last S
                S_f[i, j] = S_f[i, j] * T.exp2(g_last[0])
            for r, j in T.Parallel(C, block_dv):           # keys decayed to the chunk end,
                Vw_s[r, j] = V_s[r, j] * T.exp2(g_last[0] - G_s[r]) * real(r < L)   # on V rows
"""
WEIGHTS_ROWS = """            g_last[0] = G_s[L - 1]
            g_mid[0] = G_s[C // 2]
            for i in T.Parallel(C):
                w_query[i] = scale * T.exp2(G_s[i])
                w_key[i] = T.exp2(T.min(g_last[0] - G_s[i], 0.0))
                u_s[i] = scale * T.exp2(T.min(G_s[i] - g_mid[0], DIAGONAL_SPAN_MAX))
                w_s[i] = T.exp2(T.min(g_mid[0] - G_s[i], DIAGONAL_SPAN_MAX))
            state_decay[0] = T.exp2(g_last[0])
            for i, j in T.Parallel(DK, block_dv):
                S_f[i, j] = S_f[i, j] * state_decay[0]
            for r, j in T.Parallel(C, block_dv):           # rows past L are zeros as loaded
                Vw_s[r, j] = V_s[r, j] * w_key[r]
"""
SCORES_OF_RECORD = """            for i, j in T.Parallel(C, C):
                A[i, j] = A[i, j] * decay_factor(G_s[i] - G_s[j]) * T.if_then_else(j <= i, scale, 0.0)
"""
SCORES_FACTORED_OR_PAIRWISE = """            if G_s[0] - g_mid[0] <= DIAGONAL_SPAN_MAX and g_mid[0] - g_last[0] <= DIAGONAL_SPAN_MAX:
                for i, j in T.Parallel(C, C):
                    A[i, j] = T.if_then_else(j <= i, A[i, j] * u_s[i] * w_s[j], 0.0)
            else:
                for i, j in T.Parallel(C, C):
                    A[i, j] = A[i, j] * decay_factor(G_s[i] - G_s[j]) * T.if_then_else(j <= i, scale, 0.0)
"""
SCORES_FACTORED = """            for i, j in T.Parallel(C, C):
                A[i, j] = T.if_then_else(j <= i, A[i, j] * u_s[i] * w_s[j], 0.0)
"""
VARIANTS = {
    "of record": [],
    "rows": [IMPORTS, VECTORS, (WEIGHTS_OF_RECORD, WEIGHTS_ROWS), (SCORES_OF_RECORD, SCORES_FACTORED_OR_PAIRWISE)]
    + CUMSUM_FLAGS,
    "rows, pairwise scores": [IMPORTS, VECTORS, (WEIGHTS_OF_RECORD, WEIGHTS_ROWS)] + CUMSUM_FLAGS,
    "rows, factored scores only": [IMPORTS, VECTORS, (WEIGHTS_OF_RECORD, WEIGHTS_ROWS),
                                   (SCORES_OF_RECORD, SCORES_FACTORED)] + CUMSUM_FLAGS,
}
NAMES = list(VARIANTS)


def module(name):
    return variant_module("run60_" + name.replace(" ", "_").replace(",", ""), PATH, VARIANTS[name])


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name = NAMES[i % len(NAMES)]
    with_state = i >= len(NAMES)
    row = {"what": "compile", "variant": name, "with_state": with_state}
    try:
        mod = module(name)
        kernel = compile_program(mod.seq_in_loop_scalar, (), target=SM90A, DK=128, DV=128, dtype="bfloat16",
                                 with_state=with_state)
        if not with_state:
            compile_program(mod.chunk_cumsum, (), target=SM90A, D=1, chunk_size=64, gate_dtype="float32")
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-600:]}


def kernels(name, with_state):
    from kda.kernels.build import compile_program
    mod = module(name)
    cumsum = compile_program(mod.chunk_cumsum, (), D=1, chunk_size=64, gate_dtype="float32")
    seq = compile_program(mod.seq_in_loop_scalar, (), DK=128, DV=128, dtype="bfloat16", with_state=with_state)
    return cumsum, seq


def cumsum_call(name, cumsum, g, G, flags):
    B, T, H = g.shape
    if name == "of record":
        cumsum(g.view(B, T, H, 1), G.view(*G.shape, 1))
    else:
        cumsum(g.view(B, T, H, 1), G.view(*G.shape, 1), flags)


def check():
    import torch

    from kda.bench import random_qkv
    from kda.metrics import rel_l2
    from kda.reference import level3 as ref3
    B, T, H, D = 2, 1000 + 37, 4, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=60)
    h0 = torch.randn(B, H, D, D, device="cuda")
    for kind in ("logsigmoid", "runs of -20"):
        g = gates(B, T, H, kind, seed=61)
        o_ref, ht_ref = ref3.chunked(q.double() * D ** -0.5, k.double(), v.double(), g.double(), 64, h0.double(), True)
        for name in NAMES:
            cumsum, seq = kernels(name, True)
            G = torch.full((B, H, -(-T // 64) * 64), float("nan"), device="cuda")
            flags = torch.zeros(2, dtype=torch.int32, device="cuda")
            o = torch.full_like(v, float("nan"))
            ht = torch.full_like(h0, float("nan"))
            cumsum_call(name, cumsum, g, G, flags)
            seq(q, k, v, G, D ** -0.5, h0, o, ht)
            torch.cuda.synchronize()
            log(RUN, {"what": "check", "variant": name, "gates": kind, "shape": [B, T, H, D],
                      "nan": bool(o.isnan().any() or ht.isnan().any()), "o_rel": rel_l2(o, o_ref),
                      "ht_rel": rel_l2(ht, ht_ref), "flags": flags.tolist()})
    # the flag: a positive gate and a NaN are each caught
    for bad in (0.5, float("nan")):
        g = gates(B, T, H, "logsigmoid", seed=62)
        g[1, T - 1, 3] = bad
        cumsum, _ = kernels("rows", False)
        G = torch.empty(B, H, -(-T // 64) * 64, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        cumsum_call("rows", cumsum, g, G, flags)
        log(RUN, {"what": "flag", "bad": repr(bad), "flags": flags.tolist()})


def time_all():
    import torch
    from fla.ops.simple_gla import chunk_simple_gla

    from kda.bench import median_ms, random_qkv
    from kda.gated import gated_attention
    H, D = 32, 128
    scale = D ** -0.5
    built = {name: kernels(name, False) for name in NAMES}
    for T in (8192, 32768):
        q, k, v = random_qkv(1, T, H, D, D, seed=T)
        g = gates(1, T, H, "logsigmoid", seed=T + 1)
        G = torch.empty(1, H, T, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        o = torch.empty_like(v)
        rows = {"kda op, checked": lambda: gated_attention(q, k, v, g),
                "kda op, check_values=False": lambda: gated_attention(q, k, v, g, check_values=False),
                "fla chunk_simple_gla(g)": lambda: chunk_simple_gla(q, k, v, g=g, scale=scale)[0]}
        for name, (cumsum, seq) in built.items():
            cumsum_call(name, cumsum, g, G, flags)
            rows[f"{name}: pass"] = lambda seq=seq: seq(q, k, v, G, scale, o)
            if name != "of record":
                def op(cumsum=cumsum, seq=seq, name=name, read=True):
                    flags.zero_()
                    cumsum_call(name, cumsum, g, G, flags)
                    if read and any(flags.tolist()):
                        raise ValueError("flagged")
                    seq(q, k, v, G, scale, o)
                    return o
                rows[f"{name}: cumsum with flags, read-back, pass"] = op
                rows[f"{name}: cumsum with flags, pass"] = lambda op=op: op(read=False)
        for label, fn in rows.items():
            log(RUN, {"what": "time", "T": T, "variant": label, "ms": median_ms(fn)})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    if "compile" in steps:
        compile_in_processes(RUN, 2 * len(NAMES), compile_one)
    if "check" in steps:
        check()
    if "time" in steps:
        time_all()
