"""Run 35 (H200): two ideas against the stages of run 34, at B=1, T=32768, H=32, D=128, bf16.

* the 16 x 16 diagonal inverses right-looking (after row r is final, every row below subtracts
  its multiple, all 4 blocks x 16 rows x 16 columns at once: 15 steps of 4 FMAs per thread)
  instead of row by row (15 steps, 64 threads each summing up to 15 products): patched into
  chunk_intra's source text for this run only;
* the state pass at 16-column value stripes (256 blocks instead of 128 for 132 SMs) and 3 stages.

One JSON line per measurement to $OUT/run35.jsonl.

    python results/tuning/run35-solve-and-pass.py compile time
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, intra_outputs, kda_inputs, log, try_compile, variant_module  # noqa: E402

RUN = "run35"
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
    """kda.kernels.level5, or with the right-looking inverse in place of the row-by-row one."""
    if name != "right_looking":
        return variant_module(name)
    return variant_module(name, replacements=[
        ("\n# --8<-- [start:chunk_intra]", RIGHT_LOOKING),
        ("            invert_diagonal_blocks(A_s, Tinv_s, C, SOLVE_BLOCK)\n",
         "            invert_right_looking(A_s, Tinv_s, C, SOLVE_BLOCK)\n")])


BASE = dict(DK=128, DV=128, dtype="bfloat16")
KERNELS = [("intra", "default", BASE), ("intra", "right_looking", BASE)] + [
    ("pass", "default", dict(BASE, block_dv=bdv, num_stages=ns)) for bdv, ns in ((32, 2), (16, 2), (16, 3), (32, 3))]


def compile_one(i):
    sys.path.insert(0, ROOT)
    kind, name, params = KERNELS[i]
    stage = "chunk_intra" if kind == "intra" else "gated_state_output_pass"
    return {"compile": kind, "name": name, "params": params, **try_compile(lambda: getattr(module(name), stage), params)}


def time_all():
    import torch

    from kda.bench import median_ms
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2

    B, T, H, D = 1, 32768, 32, 128
    q, k, v, g, beta = kda_inputs(B, T, H, D)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    forms = {}
    for kind, name, params in KERNELS:
        mod = module(name)
        if kind == "intra":
            kern = compile_program(mod.chunk_intra, (), **params)
            outs = intra_outputs(q, v)
            fn = lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags)
            forms[name] = outs
        else:
            kern = compile_program(mod.gated_state_output_pass, (), **params)
            Qw, Kw, decay, A_qk, W, U = forms["default"]
            h0, o = torch.zeros(B, H, D, D, device="cuda"), torch.empty_like(v)
            ht = torch.empty(B, H, D, D, device="cuda")
            fn = lambda: kern(Qw, Kw, W, U, A_qk, decay, h0, o, ht)
        row = {"kind": kind, "name": name, "params": params, "ms": median_ms(fn)}
        if kind == "intra" and name != "default":    # the same outputs as the default solve
            row["W rel diff"] = rel_l2(forms[name][4], forms["default"][4].double())
            row["U rel diff"] = rel_l2(forms[name][5], forms["default"][5].double())
        log(RUN, row)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    if "compile" in sys.argv:
        compile_in_processes(RUN, len(KERNELS), compile_one)
    if "time" in sys.argv:
        time_all()
