"""Run 33 (H200): chunk_intra with per-sub-chunk factor tables (two exp2 per element instead of
eight) and the value checks of g and beta inside the kernel, against the run-30 kernel.

Times in one process on the same inputs: the previous chunk_intra (git show 2fb69cc:kda/kernels/
level5.py, saved as .scratch/level5_old.py), the new one, knock-out variants of the new one
(timing only: a stage removed from its source text, results wrong), level 3's form (delta=False),
and kda.chunk_kda against fla's chunk_kda at the issue's three shapes. One JSON line per
measurement to $OUT/run33.jsonl as it goes.

    python results/tuning/run33-intra-tables.py compile time
"""
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]
CFG = dict(threads=256, min_blocks=2)
OUT = os.environ.get("OUT", "/tmp")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# knock-outs: (name, text in kda/kernels/level5.py, replacement)
KNOCKOUTS = [
    ("no_solve", "            invert_diagonal_blocks(A_s, Tinv_s, C, BC)\n            merge_by_substitution(A_s, Tinv_s, C, BC)\n", ""),
    ("no_cumsum", "        log2_cumsum_by_columns(g_s, G_s, L, C, DK, flags)\n\n", "\n"),
    ("no_offdiag", "        for I in T.unroll(1, NS):", "        for I in T.unroll(1, 1):"),
    ("no_wu_gemms", "            T.gemm(Tb_s, K_s, W_f, clear_accum=True)\n            T.gemm(Tb_s, V_s, U_f, clear_accum=True)\n", ""),
]


def module(name):
    """kda.kernels.level5 (new), the saved old one, or a knock-out variant, as a fresh module."""
    path = os.path.join(ROOT, "kda/kernels/level5.py")
    if name == "old":
        path = os.path.join(ROOT, ".scratch/level5_old.py")
    src = open(path).read()
    for ko, a, b in KNOCKOUTS:
        if ko == name:
            assert src.count(a) == 1, ko
            src = src.replace(a, b)
    out = os.path.join("/tmp", f"level5_{name}.py")
    open(out, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"level5_{name}", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernels():
    out = [("old", dict(DK=128, DV=128, dtype="bfloat16", **CFG)), ("new", dict(DK=128, DV=128, dtype="bfloat16", **CFG)),
           ("new", dict(DK=128, DV=128, dtype="bfloat16", delta=False, **CFG))]
    out += [(ko, dict(DK=128, DV=128, dtype="bfloat16", **CFG)) for ko, _, _ in KNOCKOUTS]
    return out


def compile_one(i):
    sys.path.insert(0, ROOT)
    from kda.kernels.build import compile_program
    name, params = kernels()[i]
    t = time.time()
    try:
        compile_program(module(name).chunk_intra, (), **params)
        return name, params, round(time.time() - t, 1), None
    except Exception as e:  # noqa: BLE001
        return name, params, round(time.time() - t, 1), repr(e)[-400:]


def log(row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "run33.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def compile_all():
    import multiprocessing as mp
    n = len(kernels())
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        for name, params, secs, err in ex.map(compile_one, range(n)):
            log({"compile": name, "params": params, "s": secs, "error": err})


def time_all():
    import torch
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import chunk_kda
    from kda.bench import median_ms, random_qkv
    from kda.kernels.build import compile_program
    from kda.reference import level4 as ref4

    for n, (B, T, H, D) in enumerate(SHAPES):
        C, NC = 64, T // 64
        scale = D ** -0.5
        q, k, v = random_qkv(B, T, H, D, D)
        k = ref4.l2_normalize(k.float()).bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
        beta = torch.rand(B, T, H, device="cuda")
        row = {"B": B, "T": T, "H": H, "D": D}
        if n == 0:
            new = lambda shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt, device="cuda")
            outs = [new(q.shape), new(q.shape), new((B, H, NC, D), torch.float32), new((B, T, H, C)), new(k.shape),
                    new(v.shape)]
            flags = torch.zeros(2, dtype=torch.int32, device="cuda")
            for name, params in kernels():
                kern = compile_program(module(name).chunk_intra, (), **params)
                delta = params.get("delta", True)
                args = (q, k, v, g, beta, scale, *outs) if delta else (q, k, g, scale, *outs[:4])
                args = args if name == "old" else (*args, flags)
                log({**row, "what": f"chunk_intra {name}" + ("" if delta else " delta=False"),
                     "ms": median_ms(lambda: kern(*args))})
            assert flags.tolist() == [0, 0], flags
        ms_kda = median_ms(lambda: chunk_kda(q, k, v, g, beta, scale=scale))
        ms_fla = median_ms(lambda: fla_kda(q, k, v, g, beta, scale=scale))
        log({**row, "what": "chunk_kda", "kda": ms_kda, "fla": ms_fla, "ratio": ms_fla / ms_kda})


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_all()
    if "time" in sys.argv:
        time_all()
