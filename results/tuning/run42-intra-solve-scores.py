"""Run 42 (H200, planned): two stages of ``chunk_intra`` that run 41's Nsight Compute profile
(warp-state samples per SASS instruction, split at the block barriers) named as the most costly.

At (1, 8192, 32, 128), bf16, logsigmoid gates: the solve held 25% of the samples (the 16 x 16
diagonal inverses 14%: fifteen right-looking steps, each a block barrier; the merge 11%), the
scores GEMMs with their operand builds and fragment merges 19%, the elementwise scores pass 11%
(tilelang put a block barrier in each of its eight unrolled iterations, because the pass reads G,
q and k from the shared buffers it writes Ke, Qw and K 2^G into), the loads of q, k, g 11%.

Variants, each a source replacement in ``kda/kernels/level5.py``:

* ``solve by columns``: the diagonal inverses by forward substitution in registers, one thread per
  column of a diagonal block (64 threads, 120 multiply-adds each, no block barrier); the blocks
  above the diagonal are masked when ``T diag(b)`` is formed instead of zeroed before;
* ``scores from registers``: G, q and k copied to fragments first, so that the pass only writes
  shared memory (one barrier before it instead of one per iteration);
* both.

check: every output against the variant of record (rel. L2, outputs poisoned with NaN) at the
three benchmark shapes' head counts (T = 4096) and a ragged one, bf16 and fp16, logsigmoid and
-2 softplus gates; time: ``chunk_intra`` at (1, 32768, 32, 128) under both gates, and ``chunk_kda``.

    python results/tuning/run42-intra-solve-scores.py compile check time

The replacements apply to ``kda/kernels/level5.py`` as of commit 21e8621, before both changes were
adopted (327a1ea).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile, variant_module  # noqa: E402

RUN = "run42"

SOLVE_BY_COLUMNS = [
    ("from kda.kernels.level4 import invert_diagonal_blocks, merge_by_substitution",
     '''from kda.kernels.level4 import merge_by_substitution


@T.macro
def invert_diagonal_blocks_by_columns(A_s, Tinv_s, x, C, block):
    """The diagonal blocks of ``(I + A_s)^-1`` by forward substitution, one thread per column of a
    block, the column in registers: ``x_i = [i == c] - sum_{m < i} A_im x_m``."""
    for t in T.Parallel(C):
        for i in T.unroll(block):
            x[i] = real(i == t % block)
            for m in T.unroll(i):
                x[i] = x[i] - A_s[(t // block) * block + i, (t // block) * block + m] * x[m]
        for i in T.unroll(block):
            Tinv_s[(t // block) * block + i, t] = x[i]'''),
    ("""            invert_diagonal_blocks(A_s, Tinv_s, C, SOLVE_BLOCK)""",
     """            x_col = T.alloc_local([SOLVE_BLOCK], ACCUM)
            invert_diagonal_blocks_by_columns(A_s, Tinv_s, x_col, C, SOLVE_BLOCK)"""),
    ("""                Tb_s[i, j] = Tinv_s[i, j] * beta_s[j]""",
     """                Tb_s[i, j] = T.if_then_else(i // SOLVE_BLOCK >= j // SOLVE_BLOCK, Tinv_s[i, j] * beta_s[j], 0.0)"""),
]

SCORES_FROM_REGISTERS = [
    ("""        Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep = buffers""",
     """        Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep, G_f, q_f, k_f = buffers"""),
    ("""        # one pass over the chunk: two exp2 per element, everything else from the tables (every
        # buffer read here is written only at the element read, so no barrier splits the loop)
        for i, d in T.Parallel(C, DK):
            G = G_s[i, d]""",
     """        T.copy(G_s, G_f)
        T.copy(Rgt_s, q_f)
        T.copy(K_s, k_f)
        for i, d in T.Parallel(C, DK):
            G = G_f[i, d]"""),
    ("""            qx = T.Cast(ACCUM, Rgt_s[i, d]) * x
            kv = T.Cast(ACCUM, K_s[i, d])""",
     """            qx = T.Cast(ACCUM, q_f[i, d]) * x
            kv = T.Cast(ACCUM, k_f[i, d])"""),
    ("""        buffers = (Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep)""",
     """        buffers = (Lft_s, K_s, G_s, Ke_s, Rgt_s, Gend_s, Pref_s, Pend_s, Cross_s, A, A_part, too_steep,
                   T.alloc_fragment([C, DK], ACCUM), T.alloc_fragment([C, DK], dtype), T.alloc_fragment([C, DK], dtype))"""),
]

VARIANTS = {"of record": [], "solve by columns": SOLVE_BY_COLUMNS, "scores from registers": SCORES_FROM_REGISTERS,
            "both": SOLVE_BY_COLUMNS + SCORES_FROM_REGISTERS}
CONFIGS = [dict(DK=128, DV=128, dtype="bfloat16"), dict(DK=128, DV=128, dtype="float16")]


def module(name):
    return variant_module(name.replace(" ", "_"), replacements=VARIANTS[name])


def compile_one(i):
    sys.path.insert(0, ROOT)
    name, cfg = list(VARIANTS)[i % len(VARIANTS)], CONFIGS[i // len(VARIANTS)]
    return {"compile": name, "dtype": cfg["dtype"], **try_compile(lambda: module(name).chunk_intra, cfg)}


def gates(shape, kind):
    import torch
    x = torch.randn(*shape, device="cuda")
    return torch.nn.functional.logsigmoid(x) if kind == "logsigmoid" else -2 * torch.nn.functional.softplus(x)


def check():
    import torch

    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    names = ["Qw", "Kw", "decay", "A_qk", "W", "U"]
    mods = {name: module(name) for name in VARIANTS}
    for (B, T, H, D), dtype in [((1, 4096, 32, 128), torch.bfloat16), ((2, 1000, 4, 128), torch.bfloat16),
                                ((2, 1000, 4, 128), torch.float16)]:
        q, k, v, _, beta = kda_inputs(B, T, H, D)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        for kind in ("logsigmoid", "-2 softplus"):
            g = gates((B, T, H, D), kind)
            ref = None
            for name, mod in mods.items():
                kern = compile_program(mod.chunk_intra, (), DK=D, DV=D, dtype=str(dtype).removeprefix("torch."))
                outs = intra_outputs(q, v)
                for o in outs:
                    o.fill_(float("nan"))
                flags = torch.zeros(2, dtype=torch.int32, device="cuda")
                kern(q, k, v, g, beta, D ** -0.5, *outs, flags)
                torch.cuda.synchronize()
                if ref is None:
                    ref = outs
                log(RUN, {"check": name, "shape": [B, T, H, D], "dtype": str(dtype), "gate": kind,
                          "nan": any(bool(o.isnan().any()) for o in outs),
                          **{n: float(rel_l2(o.double(), r.double())) for n, o, r in zip(names, outs, ref)}})


def time_all():
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms
    from kda.kernels import level5
    from kda.kernels.build import compile_program
    B, T, H, D = 1, 32768, 32, 128
    q, k, v, _, beta = kda_inputs(B, T, H, D)
    outs = intra_outputs(q, v)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    for kind in ("logsigmoid", "-2 softplus"):
        g = gates((B, T, H, D), kind)
        for name in VARIANTS:
            kern = compile_program(module(name).chunk_intra, (), DK=D, DV=D, dtype="bfloat16")
            log(RUN, {"what": "chunk_intra", "variant": name, "gate": kind,
                      "ms": median_ms(lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags))})
    g = gates((B, T, H, D), "logsigmoid")
    adopted = level5.chunk_intra
    for name in VARIANTS:
        level5.chunk_intra = module(name).chunk_intra
        log(RUN, {"what": "chunk_kda", "variant": name, "check_values": False,
                  "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=False))})
    level5.chunk_intra = adopted


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS) * len(CONFIGS), compile_one)
    if "check" in sys.argv:
        check()
    if "time" in sys.argv:
        time_all()
