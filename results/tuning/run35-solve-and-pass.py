"""Run 35 (H200): two ideas against the stages of run 34, at B=1, T=32768, H=32, D=128, bf16.

* the 16 x 16 diagonal inverses right-looking (after row r is final, every row below subtracts
  its multiple, all 4 blocks x 16 rows x 16 columns at once: 15 steps of 4 FMAs per thread)
  instead of row by row (15 steps, 64 threads each summing up to 15 products): patched into
  chunk_intra's source text for this run only;
* the state pass at 16-column value stripes (256 blocks instead of 128 for 132 SMs) and 3 stages.

One JSON line per measurement to $OUT/run35.jsonl.

    python results/tuning/run35-solve-and-pass.py compile time
"""
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

OUT = os.environ.get("OUT", "/tmp")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RIGHT_LOOKING = '''
@T.macro
def invert_right_looking(A_s, Tinv_s, C, block):
    n = C // block
    for i, j in T.Parallel(C, C):
        Tinv_s[i, j] = real(i == j)
    for r in T.serial(block - 1):          # row r is final: remove it from the rows below
        for I, i, c in T.Parallel(n, block, block):
            if i > r:
                if c <= r:
                    Tinv_s[I * block + i, I * block + c] = (Tinv_s[I * block + i, I * block + c]
                        - A_s[I * block + i, I * block + r] * Tinv_s[I * block + r, I * block + c])


# --8<-- [start:chunk_intra]'''


def module(name):
    src = open(os.path.join(ROOT, "kda/kernels/level5.py")).read()
    if name == "right_looking":
        src = src.replace("\n# --8<-- [start:chunk_intra]", RIGHT_LOOKING, 1)
        a = "            invert_diagonal_blocks(A_s, Tinv_s, C, SOLVE_BLOCK)\n"
        assert src.count(a) == 1
        src = src.replace(a, "            invert_right_looking(A_s, Tinv_s, C, SOLVE_BLOCK)\n")
    out = os.path.join("/tmp", f"level5_{name}.py")
    open(out, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"level5_{name}", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BASE = dict(DK=128, DV=128, dtype="bfloat16")
KERNELS = [("intra", "default", BASE), ("intra", "right_looking", BASE)] + [
    ("pass", "default", dict(BASE, block_dv=bdv, num_stages=ns)) for bdv, ns in ((32, 2), (16, 2), (16, 3), (32, 3))]


def compile_one(i):
    sys.path.insert(0, ROOT)
    from kda.kernels.build import compile_program
    kind, name, params = KERNELS[i]
    mod = module(name)
    fn = mod.chunk_intra if kind == "intra" else mod.gated_state_output_pass
    t = time.time()
    try:
        compile_program(fn, (), **params)
        return kind, name, params, round(time.time() - t, 1), None
    except Exception as e:  # noqa: BLE001
        return kind, name, params, round(time.time() - t, 1), repr(e)[-400:]


def log(row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "run35.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def compile_all():
    import multiprocessing as mp
    with ProcessPoolExecutor(max_workers=len(KERNELS), mp_context=mp.get_context("spawn")) as ex:
        for kind, name, params, secs, err in ex.map(compile_one, range(len(KERNELS))):
            log({"compile": kind, "name": name, "params": params, "s": secs, "error": err})


def time_all():
    import torch

    from kda.bench import median_ms, random_qkv
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4

    B, T, H, D, C = 1, 32768, 32, 128, 64
    NC = T // C
    q, k, v = random_qkv(B, T, H, D, D)
    k = ref4.l2_normalize(k.float()).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
    beta = torch.rand(B, T, H, device="cuda")
    new = lambda shape, dt=torch.bfloat16: torch.empty(shape, dtype=dt, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    forms = {}
    for kind, name, params in KERNELS:
        mod = module(name)
        if kind == "intra":
            kern = compile_program(mod.chunk_intra, (), **params)
            outs = [new(q.shape), new(q.shape), new((B, H, NC, D), torch.float32), new((B, T, H, C)), new(k.shape),
                    new(v.shape)]
            fn = lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags)
            forms[name] = outs
        else:
            kern = compile_program(mod.gated_state_output_pass, (), **params)
            Qw, Kw, decay, A_qk, W, U = forms["default"]
            h0, o, ht = torch.zeros(B, H, D, D, device="cuda"), new(v.shape), new((B, H, D, D), torch.float32)
            fn = lambda: kern(Qw, Kw, W, U, A_qk, decay, h0, o, ht)
        row = {"kind": kind, "name": name, "params": params, "ms": median_ms(fn)}
        if kind == "intra" and name != "default":    # the same outputs as the default solve
            row["W rel diff"] = rel_l2(forms[name][4], forms["default"][4].double())
            row["U rel diff"] = rel_l2(forms[name][5], forms["default"][5].double())
        log(row)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_all()
    if "time" in sys.argv:
        time_all()
