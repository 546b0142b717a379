"""Run 57 (H200): level 2's decay weights without a branch and without an ``exp2`` per element.

Level 2 (``kda.kernels.level2.seq_in_loop``) takes 0.592 ms at (1, 32768, 32, 128) where level 1,
the same loop without the decay, takes 0.468 (records of f7341ee): the weights cost a quarter of the
time, and the goal (1.5x fla's ``chunk_simple_gla``, 0.778 ms) is 0.519. Per chunk a thread computes
an ``exp2`` for every element it holds of the query weights (``C x block_dv`` in all) and of the key
weights, though a thread's accumulator fragment spans two rows only; the key weights come with a
branch on ``r < L``. ``weight_tables=True`` (fragments ``[C, block_dv]`` in registers) was slower
(0.627 ms). Variants, each built from the module's source:

* ``branch-free``: ``Vw = V 2^min(lg (L - 1 - r), 0)``: rows past ``L`` are zeros as loaded, so the
  mask is not needed, and the exponent is never positive;
* ``row vectors``: ``scale 2^(lg (i + 1))`` and ``2^(lg (C - 1 - r))`` computed once per block into two
  ``[C]`` float32 vectors in shared memory (no registers held), read by row; full chunks call no
  ``exp2`` at all, the tail computes its key weights as in ``branch-free``;
* ``row vectors, 2 stages``: the same with a pipeline of two stages instead of three (two
  warpgroups, ``threads=256``, fail in tilelang's layout inference: ``A`` against ``A_cast``).

Each variant's ``O`` and final state are compared bit for bit with the module of record at
T = 32768 + 37 (a ragged tail) with an initial state; then all are timed beside fla in one process.

    python results/tuning/run57-level2-row-weights.py compile check time                  # first call
    RUN57_CALL=2 python results/tuning/run57-level2-row-weights.py compile check time     # second call

Second call (``RUN57_CALL=2``): ``branch-free`` with ``a^L`` computed once per chunk into a local
(``carry once``), the query weights read from a ``[C]`` vector in shared memory (``query rows``, no
branch), and the key weights by ``__expf`` (``fast exp``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, log, variant_module  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run57"
PATH = "kda/kernels/level2.py"

BRANCH = ("""                Vw_s[r, j] = T.if_then_else(                      # padding: never exp2 of
                    r < L, V_s[r, j] * T.exp2(lg * (L - 1 - r)), 0.0)   # a positive number""",
          """                Vw_s[r, j] = V_s[r, j] * T.exp2(T.min(lg * (L - 1 - r), 0.0))""")
ROWS = [
    ("""        lg = T.alloc_local([1], ACCUM)""",
     """        lg = T.alloc_local([1], ACCUM)
        wq_s = T.alloc_shared([C], ACCUM)
        wk_s = T.alloc_shared([C], ACCUM)"""),
    ("""        if weight_tables:
            for i, j in T.Parallel(C, block_dv):
                W_query[i, j] = scale * T.exp2(lg[0] * (i + 1))""",
     """        for i in T.Parallel(C):
            wq_s[i] = scale * T.exp2(lg[0] * (i + 1))
            wk_s[i] = T.exp2(lg[0] * (C - 1 - i))
        if weight_tables:
            for i, j in T.Parallel(C, block_dv):
                W_query[i, j] = scale * T.exp2(lg[0] * (i + 1))"""),
    ("""            for i, j in T.Parallel(DK, block_dv):                 # place 3, carry side
                S_f[i, j] = S_f[i, j] * T.exp2(lg * L)
            for r, j in T.Parallel(C, block_dv):                  # place 2; rows past L are
                Vw_s[r, j] = T.if_then_else(                      # padding: never exp2 of
                    r < L, V_s[r, j] * T.exp2(lg * (L - 1 - r)), 0.0)   # a positive number""",
     """            for i, j in T.Parallel(DK, block_dv):                 # place 3, carry side
                S_f[i, j] = S_f[i, j] * T.if_then_else(L == C, carry, T.exp2(lg * L))
            for r, j in T.Parallel(C, block_dv):
                Vw_s[r, j] = V_s[r, j] * T.if_then_else(L == C, wk_s[r], T.exp2(T.min(lg * (L - 1 - r), 0.0)))"""),
    ("""                for i, j in T.Parallel(C, block_dv):
                    acc_o[i, j] = acc_o[i, j] * (scale * T.exp2(lg[0] * (i + 1)))""",
     """                for i, j in T.Parallel(C, block_dv):
                    acc_o[i, j] = acc_o[i, j] * wq_s[i]"""),
    ("""    def decay_state(V_s, Vw_s, S_f, W_key, carry, lg, L):""",
     """    def decay_state(V_s, Vw_s, S_f, W_key, carry, lg, L, wk_s):"""),
    ("""                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L)
                # Only""",
     """                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L, wk_s)
                # Only"""),
    ("""                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L)
                T.gemm(K_s, Vw_s, S_f, transpose_A=True)
""",
     """                decay_state(V_s, Vw_s, S_f, W_key, carry[0], lg[0], L, wk_s)
                T.gemm(K_s, Vw_s, S_f, transpose_A=True)
"""),
]
# second call: the branch-free key weights with the other weights made cheaper
CARRY_LOCAL = ("""            for i, j in T.Parallel(DK, block_dv):                 # place 3, carry side
                S_f[i, j] = S_f[i, j] * T.exp2(lg * L)
            for r, j in T.Parallel(C, block_dv):                  # place 2; rows past L are""",
               """            carry_L = T.alloc_local([1], ACCUM)
            carry_L[0] = T.exp2(lg * L)
            for i, j in T.Parallel(DK, block_dv):                 # place 3, carry side
                S_f[i, j] = S_f[i, j] * carry_L[0]
            for r, j in T.Parallel(C, block_dv):                  # place 2; rows past L are""")
QUERY_ROWS = [ROWS[0], ROWS[3],
              ("""        if weight_tables:
            for i, j in T.Parallel(C, block_dv):
                W_query[i, j] = scale * T.exp2(lg[0] * (i + 1))""",
               """        for i in T.Parallel(C):
            wq_s[i] = scale * T.exp2(lg[0] * (i + 1))
            wk_s[i] = 0.0
        if weight_tables:
            for i, j in T.Parallel(C, block_dv):
                W_query[i, j] = scale * T.exp2(lg[0] * (i + 1))""")]
FAST_KEY = ("""                Vw_s[r, j] = V_s[r, j] * T.exp2(T.min(lg * (L - 1 - r), 0.0))""",
            """                Vw_s[r, j] = V_s[r, j] * T.__exp(T.min(lg * (L - 1 - r), 0.0) * 0.6931471805599453)""")
VARIANTS = {"of record": ([], {}), "branch-free": ([BRANCH], {}), "row vectors": (ROWS, {}),
            "row vectors, 2 stages": (ROWS, {"num_stages": 2})}
if os.environ.get("RUN57_CALL") == "2":
    VARIANTS = {"of record": ([], {}), "branch-free": ([BRANCH], {}),
                "branch-free, carry once": ([CARRY_LOCAL, BRANCH], {}),
                "branch-free, carry once, query rows": ([CARRY_LOCAL, BRANCH] + QUERY_ROWS, {}),
                "branch-free, carry once, query rows, fast exp": ([CARRY_LOCAL, BRANCH] + QUERY_ROWS + [FAST_KEY], {})}
NAMES = list(VARIANTS)


def module(name):
    reps, _ = VARIANTS[name]
    return variant_module("run57_" + name.replace(" ", "_").replace(",", ""), PATH, reps)


def compile_one(i):
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    name = NAMES[i % len(NAMES)]
    with_state = i >= len(NAMES)
    row = {"what": "compile", "variant": name, "with_state": with_state}
    try:
        kernel = compile_program(module(name).seq_in_loop, (), target=SM90A, DK=128, DV=128, dtype="bfloat16",
                                 with_state=with_state, **VARIANTS[name][1])
        return {**row, **ptxas_report(kernel)}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-600:]}


def kernels(with_state):
    from kda.kernels.build import compile_program
    return {name: compile_program(module(name).seq_in_loop, (), DK=128, DV=128, dtype="bfloat16",
                                  with_state=with_state, **VARIANTS[name][1]) for name in NAMES}


def inputs(T, seed):
    import torch

    from kda.bench import random_qkv
    H = 32
    q, k, v = random_qkv(1, T, H, 128, 128, seed=seed)
    alpha = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    return q, k, v, alpha


def check():
    import torch

    from kda.metrics import rel_l2
    from kda.reference import level2 as ref
    T = 32768 + 37
    q, k, v, alpha = inputs(T, seed=57)
    log2_alpha = torch.log2(alpha).float().cuda()
    h0 = torch.randn(1, 32, 128, 128, device="cuda")
    runs = {}
    for name, kernel in kernels(True).items():
        o = torch.full_like(v, float("nan"))
        ht = torch.full_like(h0, float("nan"))
        kernel(q, k, v, log2_alpha, 128 ** -0.5, h0, o, ht)
        runs[name] = (o, ht)
    expected = ref.chunked(q.double() * 128 ** -0.5, k, v, alpha, initial_state=h0.double())[0]
    o0, ht0 = runs["of record"]
    for name, (o, ht) in runs.items():
        log(RUN, {"what": "check", "variant": name, "T": T, "nan": bool(o.isnan().any() or ht.isnan().any()),
                  "o_equal_to_record": bool(torch.equal(o, o0)), "ht_equal_to_record": bool(torch.equal(ht, ht0)),
                  "o_vs_float64": rel_l2(o, expected)})


def time_all():
    import torch

    from kda.bench import fla_decay_attention, median_ms
    ks = kernels(False)
    for T in (8192, 32768):
        q, k, v, alpha = inputs(T, seed=T)
        log2_alpha = torch.log2(alpha).float().cuda()
        g_gamma = torch.log(alpha).float().cuda()
        o = torch.empty_like(v)
        for name, kernel in ks.items():
            log(RUN, {"what": "time", "T": T, "variant": name,
                      "ms": median_ms(lambda: kernel(q, k, v, log2_alpha, 128 ** -0.5, o))})
        log(RUN, {"what": "time", "T": T, "variant": "fla chunk_simple_gla",
                  "ms": median_ms(lambda: fla_decay_attention(q, k, v, g_gamma, 128 ** -0.5))})


if __name__ == "__main__":
    steps = sys.argv[1:] or ["compile", "check", "time"]
    if "compile" in steps:
        compile_in_processes(RUN, 2 * len(NAMES), compile_one)
    if "check" in steps:
        check()
    if "time" in steps:
        time_all()
