"""Run 128 (prepared 2026-12-06): one chunk_kda call for a profiler or a sanitizer to watch. ``--call`` picks the call
(``plain``: mild gates, unit keys; ``layer``: a layer's softplus call, the raw gate in bf16; ``safe``: the same with
safe_gate), ``--shape B,T,H,D`` its size, ``--dtype`` bf16 or fp16. The call runs once to compile (``--warm`` only
that), then once more: chunk_intra is the first kernel of each call and the state pass the second (both named
main_kernel, or with_activations_kernel for chunk_intra of an activated call), so ``ncu --launch-skip 2 --launch-count 1``
picks the second call's chunk_intra.

    python results/tuning/run128-profile.py --warm-all          # every call compiled, in parallel processes
    python results/tuning/run128-profile.py --call layer --shape 1,8192,96,128
    ncu --clock-control none -k "regex:main_kernel|with_activations_kernel" --launch-skip 2 --launch-count 1 --set full \
        python results/tuning/run128-profile.py --call layer
    compute-sanitizer --tool synccheck python results/tuning/run128-profile.py --call layer --shape 1,200,2,128
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


CALLS = ("plain", "layer", "safe")


def one_call(call, shape, dtype_name, warm):
    """The call ``call`` at ``shape`` ("B,T,H,D") in ``dtype_name``, once to compile, then (unless ``warm``) again."""
    import kda
    from kda.reference import level4 as ref

    B, T, H, D = map(int, shape.split(","))
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    q, k, v, raw, logits, A_log, dt_bias = (x.to(dtype) if x.dtype == torch.bfloat16 else x
                                            for x in harness.layer_inputs(B, T, H, D))
    if call == "plain":
        qn, kn = (ref.l2_normalize(x.float()).to(dtype) for x in (q, k))
        run = lambda: kda.chunk_kda(qn, kn, v, torch.nn.functional.logsigmoid(raw), torch.sigmoid(logits))
    else:
        bound = dict(safe_gate=True, lower_bound=-5.0) if call == "safe" else {}
        run = lambda: kda.chunk_kda(q * 3, k * 3, v, raw.to(dtype), logits, A_log=A_log, dt_bias=dt_bias,
                                     use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                     use_qk_l2norm_in_kernel=True, **bound)
    o = run()[0]
    torch.cuda.synchronize()
    if not warm:
        o = run()[0]
        torch.cuda.synchronize()
    return f"{call} {shape} {dtype_name}: o finite {bool(torch.isfinite(o).all())}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--call", choices=CALLS, default="layer")
    parser.add_argument("--shape", default="1,8192,96,128")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--warm-all", action="store_true", help="every call in both dtypes compiled, in parallel")
    args = parser.parse_args()
    if args.warm_all:
        import concurrent.futures as futures
        import multiprocessing

        cases = [(call, "1,256,2,128", d, True) for call in CALLS for d in ("bf16", "fp16")]
        with futures.ProcessPoolExecutor(len(cases), mp_context=multiprocessing.get_context("spawn")) as pool:
            for done in futures.as_completed([pool.submit(one_call, *case) for case in cases]):
                try:
                    print("warm:", done.result(), flush=True)
                except Exception as e:
                    print("warm failed:", repr(e)[:300], flush=True)
        return
    print(one_call(args.call, args.shape, args.dtype, args.warm), flush=True)


if __name__ == "__main__":
    main()
