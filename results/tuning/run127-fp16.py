"""Run 127 (prepared 2026-12-06): which of the two changes failed run 126's fp16 "kept, fast" tests of the layer's
activated call: the raw gate in fp16 (a buffer of its own in chunk_intra, never before run on a GPU) or the
activations by ex2 and lg2 (FAST_ACTIVATIONS). chunk_kda in fp16 at (2, 200, 3, 128), as the test calls it (both
forms, dense), each of raw gate float32 / fp16 and fast off / on in its own process; the relative L2 error of ``o``
and the final state against the float64 recurrence, and whether ``o`` is finite. Rows to ``$OUT/run127.jsonl``.

    python results/tuning/run127-fp16.py
"""
import concurrent.futures as futures
import json
import multiprocessing
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
OUT = os.environ.get("OUT", "/tmp")


def one(case):
    import torch

    import kda
    from kda.kernels import chunk_intra
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    from kda.reference import level4 as ref4

    form, raw_dtype, fast = case
    chunk_intra.FAST_ACTIVATIONS = fast
    chunk_intra.FAST_ACTIVATIONS_DTYPES = ("bfloat16", "float16")
    B, T, H, D, dtype = 2, 200, 3, 128, torch.float16
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = ((torch.randn(B, T, H, D, generator=gen, device="cuda") * s).to(dtype) for s in (3, 5, 1))
    raw = torch.randn(B, T, H, D, generator=gen, device="cuda").to(getattr(torch, raw_dtype))
    logits = torch.randn(B, T, H, generator=gen, device="cuda")
    A_log = torch.log(torch.empty(H, device="cuda").uniform_(1, 16, generator=gen))
    dt_bias = 0.1 * torch.randn(H * D, generator=gen, device="cuda")
    h0 = torch.randn(B, H, D, D, generator=gen, device="cuda")
    bound = dict(safe_gate=True, lower_bound=-5.0) if form == "sigmoid" else {}
    o, ht = kda.chunk_kda(q, k, v, raw, logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                          use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, initial_state=h0,
                          output_final_state=True, **bound)
    qn, kn = ref4.l2_normalize(q.double()), ref4.l2_normalize(k.double())
    x, A = raw.double() + dt_bias.double().view(H, D), A_log.double().exp()[:, None]
    g = -A * torch.nn.functional.softplus(x) if form == "softplus" else -5.0 * torch.sigmoid(A * x)
    ref_o, ref_ht = ref0.recurrent(qn * D ** -0.5, kn, v, g, torch.sigmoid(logits.double()), h0, True)
    finite = torch.isfinite(o)
    return {"form": form, "raw gate": raw_dtype, "fast": fast, "o finite": bool(finite.all()),
            "heads not finite": [list(map(int, i)) for i in (~finite).any(-1).any(1).nonzero().tolist()],
            "o rel_l2": float(f"{rel_l2(o.nan_to_num(), ref_o):.2e}"),
            "ht rel_l2": float(f"{rel_l2(ht.nan_to_num(), ref_ht):.2e}")}


def main():
    cases = [(form, raw, fast) for form in ("softplus", "sigmoid") for raw in ("float32", "float16")
             for fast in (False, True)]
    with futures.ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
        for case, done in zip(cases, [pool.submit(one, c) for c in cases]):
            try:
                row = done.result()
            except Exception as e:
                row = {"case": case, "error": repr(e)[:400]}
            print(json.dumps(row), flush=True)
            with open(os.path.join(OUT, "run127.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
