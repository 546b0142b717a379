"""Run 98 (prepared 2026-12-04, not yet run): compile, in parallel processes, every backward that the
backward chapter's two missing records run, so that one call can record them.

Run 97 found why `snippets/backward/gpu_error.py` and `latency.py` never finish within a call: fla's (and
FlashQLA's) backward autotunes each kernel for every new key (dtype, packed or not, number of heads),
compiling every configuration in turn in one process, and a call carries only the autotune choices to the
next, not the compiled configurations. Here each configuration the snippets use (op, implementation,
dtype, shape, packed) runs one forward and backward in its own process, all at once, so that the compiles
share the machine's cores and land in the Triton and TileLang caches. The caller points TRITON_CACHE_DIR
at a scratch folder and then keeps the compiled kernels but not the choices (kda.site.rerecord's
``keep_compiled``), so that the choices the timing uses are made again on a quiet GPU, by the record
itself, from compiled kernels.

    FLA_FLASH_QLA=0 TRITON_CACHE_DIR=/tmp/warm-triton python results/tuning/run98-warm.py --budget 240
    FLA_FLASH_QLA=0 python results/tuning/run98-warm.py --list        # the configurations, nothing run
"""
import argparse
import concurrent.futures as futures
import multiprocessing
import os
import sys
import time

# (snippet, op, implementation, dtype, (B, T, H, D), packed lengths or None, with states)
ERROR_CASES = [("gpu_error", op, impl, dtype, (1, 300, 4, 128), lengths, True)
               for op in ("KDA", "GDN") for impl in ("kda", "fla")
               for dtype, lengths in (("bfloat16", None), ("float16", None), ("bfloat16", (0, 1, 100, 199)))]
LATENCY_CASES = [("latency", op, impl, "bfloat16", shape, None, False)
                 for shape in ((1, 32768, 32, 128), (1, 8192, 96, 128))
                 for op, impls in (("KDA", ("kda", "fla")), ("GDN", ("kda", "fla", "flashqla")))
                 for impl in impls]
CASES = ERROR_CASES + LATENCY_CASES


def function(op, impl):
    if impl == "kda":
        import kda
        return kda.chunk_kda if op == "KDA" else kda.chunk_gated_delta_rule
    if impl == "flashqla":
        import flash_qla
        return flash_qla.chunk_gated_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda
    return chunk_kda if op == "KDA" else chunk_gated_delta_rule


def forward_backward(case) -> float:
    """One forward and backward of ``case`` on fresh random inputs; the seconds it took (compiles included)."""
    import torch

    _, op, impl, dtype, (B, T, H, D), lengths, states = case
    start = time.time()
    dtype = getattr(torch, dtype)
    rand = lambda *shape: torch.randn(*shape, device="cuda")
    N = 1 if lengths is None else len(lengths)
    t = T if lengths is None else sum(lengths)
    q, v = rand(B, t, H, D).to(dtype), rand(B, t, H, D).to(dtype)
    k = torch.nn.functional.normalize(rand(B, t, H, D), dim=-1).to(dtype)
    g = torch.nn.functional.logsigmoid(rand(B, t, H, *([D] if op == "KDA" else [])))
    beta = torch.rand(B, t, H, device="cuda").to(dtype)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
    kwargs = {}
    if lengths is not None:
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        kwargs["cu_seqlens"] = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    if states:
        leaves.append(rand(N * B, H, D, D).requires_grad_())
        kwargs.update(initial_state=leaves[-1], output_final_state=True)
    o, final = function(op, impl)(*leaves[:5], scale=D ** -0.5, **kwargs)
    outputs, grads = [o], [torch.randn_like(o)]
    if final is not None:
        outputs.append(final)
        grads.append(torch.randn_like(final))
    torch.autograd.grad(outputs, leaves, grads)
    torch.cuda.synchronize()
    return time.time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=240, help="seconds for all of them")
    parser.add_argument("--workers", type=int, default=min(len(CASES), os.cpu_count() or 1))
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print("\n".join(map(str, CASES)))
        return 0
    assert os.environ.get("FLA_FLASH_QLA") == "0", "FLA_FLASH_QLA=0, as the snippets run fla's own GDN"
    start, failed = time.time(), 0
    pool = futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    jobs = {pool.submit(forward_backward, case): case for case in CASES}
    try:
        for job in futures.as_completed(jobs, timeout=args.budget):
            case = jobs[job]
            try:
                print(f"{time.time() - start:6.0f} s  done in {job.result():6.1f} s: {case}", flush=True)
            except Exception as e:                       # shown, not fatal: the record will say more
                failed += 1
                print(f"{time.time() - start:6.0f} s  failed: {case}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    except futures.TimeoutError:
        for job, case in jobs.items():
            if not job.done():
                print(f"not finished within {args.budget:.0f} s: {case}", flush=True)
        for process in list(pool._processes.values()):
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
