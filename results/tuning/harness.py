"""What the tuning-run scripts share: one JSON line per measurement, printed and appended to
``$OUT/<run>.jsonl``; a call timed and compared against the first (``timed``, ``against``); kernels
compiled in parallel processes before anything is timed (a cold H200 machine spends minutes
compiling); gates with steep runs; a profile of every kernel of a call. (The source-variant helpers of
runs 33-71 went with those scripts; the README's log names the commit that holds them.)"""
import importlib.util
import json
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

OUT = os.environ.get("OUT", "/tmp")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(file_name):
    """Another tuning script of this folder (``"run140-gdn.py"``), loaded as a module (its name has a dash)."""
    spec = importlib.util.spec_from_file_location(file_name[:-3].replace("-", "_"),
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), file_name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(run, row):
    """Print ``row`` and append it to ``$OUT/<run>.jsonl``."""
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, f"{run}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def timed(run, row, fn, describe=None, peak=False, warmup_ms=100, rep_ms=500):
    """``row`` logged to ``run`` with ``fn``'s median time (``kda.bench.median_ms``), its peak memory above what was
    allocated before (``peak``) and what ``describe(its output)`` adds; or with the error that stopped it."""
    import torch

    from kda.bench import median_ms

    try:
        got = fn()
        row["ms"] = round(median_ms(fn, warmup_ms=warmup_ms, rep_ms=rep_ms), 3)
        if peak:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            row["peak_MB"] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20)
        row.update(describe(got) if describe else {})
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    log(run, row)


def against(first):
    """A describer: finiteness, and the relative L2 of each output against the first call's."""
    import torch

    from kda.metrics import rel_l2

    def describe(got):
        got = got if isinstance(got, (list, tuple)) else [got]
        first.append(got)
        return {"finite": all(bool(torch.isfinite(x).all()) for x in got),
                "rel_l2_vs_first": [float(f"{rel_l2(a.float(), b.float()):.2e}") for a, b in zip(got, first[0])]}
    return describe


def compile_in_processes(run, n, compile_one):
    """``compile_one(i)`` for ``i < n`` in ``n`` spawned processes; each returned row is logged."""
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        for row in ex.map(compile_one, range(n)):
            log(run, row)


def layer_inputs(B, T, H, D, seed=41):
    """KDA's inputs as a layer calls ``chunk_kda`` (bf16 ``q, k, v``; the raw gate, beta's logits, ``A_log`` as a layer
    initialises it, ``dt_bias``), on the GPU: ``(q, k, v, raw, logits, A_log, dt_bias)``."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16() for _ in range(3))
    raw = torch.randn(B, T, H, D, generator=gen, device="cuda")
    logits = torch.randn(B, T, H, generator=gen, device="cuda")
    A_log = torch.log(torch.empty(H, device="cuda").uniform_(1, 16, generator=gen))
    dt_bias = 0.1 * torch.randn(H * D, generator=gen, device="cuda")
    return q, k, v, raw, logits, A_log, dt_bias


def grouped_gdn_inputs(B, T, HQ, HV, D=128):
    """GDN's inputs with grouped value heads (``HQ`` query and key heads, ``HV`` value heads), bf16, unit keys,
    logsigmoid gates: ``(q, k, v, g, beta)``."""
    import torch

    from kda.reference import level4 as ref

    gen = torch.Generator(device="cuda").manual_seed(T + HV)
    q, k = (torch.randn(B, T, HQ, D, generator=gen, device="cuda").bfloat16() for _ in range(2))
    k = ref.l2_normalize(k.float()).bfloat16()
    v = torch.randn(B, T, HV, D, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, generator=gen, device="cuda"))
    beta = torch.rand(B, T, HV, generator=gen, device="cuda").bfloat16()
    return q, k, v, g, beta


def scalar_gates(B, T, H, kind, seed):
    """One gate per head, ``logsigmoid(x)``, ``x ~ N(0, 1)``; ``"runs of -20"`` sets two runs of
    steps (200 and 20 tokens) to -20 (runs 60 and 61)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
    if kind == "runs of -20":
        g[:, 100:300] = -20.0
        g[:, 700:720] = -20.0
    return g


def profile(run, path, steps=3, title=""):
    """The CUDA time of every kernel and torch operation over ``steps`` calls of ``run`` (after one), by
    ``torch.profiler``, written to ``path`` with every launch of the last call in order (TileLang names most
    of its kernels ``main_kernel``, which the table lumps together). Returns the CUDA milliseconds per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    run()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    events = prof.key_averages()
    table = events.table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90)
    launches = sorted((e.time_range.start, e.name, e.time_range.elapsed_us()) for e in prof.events()
                      if str(getattr(e, "device_type", "")).endswith("CUDA"))
    last = launches[-len(launches) // steps:] if launches else []
    with open(path, "w") as f:
        f.write(f"{title}{steps} steps\n{table}\n\nthe last call's launches in order (us):\n")
        f.writelines(f"{us:10.1f}  {kernel[:110]}\n" for _, kernel, us in last)
    print(table[:4000], flush=True)
    return sum(e.self_device_time_total for e in events) / steps / 1e3


def stage_times(run, row, fn, calls=5):
    """``row`` logged with the GPU milliseconds of each kernel ``kda.kernels.build`` compiled (CUDA events around
    its launches, by factory name; a factory launched twice adds up), the whole call's, and the rest (torch's
    operations and the gaps between launches) as ``other``: medians over ``calls`` calls after one. The kernels
    must be compiled after ``time_stages()`` is called (its wrapper goes around what compile_program returns)."""
    import statistics

    import torch

    fn()
    per_call = []
    for _ in range(calls):
        torch.cuda.synchronize()
        _STAGES["log"] = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        got = {"total": start.elapsed_time(end)}
        for name, e0, e1 in _STAGES["log"]:
            got[name] = got.get(name, 0.0) + e0.elapsed_time(e1)
        got["other"] = got["total"] - sum(v for k, v in got.items() if k != "total")
        per_call.append(got)
        _STAGES["log"] = None
    names = list(per_call[-1])
    row["stages_ms"] = {n: round(statistics.median(c.get(n, 0.0) for c in per_call), 3) for n in names}
    log(run, row)


_STAGES = {"log": None}


def time_stages():
    """Wrap ``kda.kernels.build.compile_program`` so that ``stage_times`` sees every kernel launched."""
    import torch

    from kda.kernels import build

    compile_program = build.compile_program

    class Timed:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getattr__(self, attr):
            return getattr(self.kernel, attr)

        def __call__(self, *args, **kwargs):
            if _STAGES["log"] is None:
                return self.kernel(*args, **kwargs)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            got = self.kernel(*args, **kwargs)
            e1.record()
            _STAGES["log"].append((self.name, e0, e1))
            return got

    def timed_compile(program_fn, out_idx, target=None, pass_configs=None, **params):
        return Timed(compile_program(program_fn, out_idx, target, pass_configs, **params), program_fn.__name__)

    build.compile_program = timed_compile


def host_times(fn):
    """The host's milliseconds per call of ``fn`` queued back to back (50 calls, then one synchronize), the whole
    loop's per call, and one call's from an idle GPU (median of 20): where the first equals the second, the host is
    the limit (runs 151 and 162)."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    one = []
    for _ in range(20):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn()
        one.append(time.perf_counter() - s)
    return {"queued_host_ms": round((t1 - t0) / 50 * 1e3, 4), "queued_all_ms": round((t2 - t0) / 50 * 1e3, 4),
            "idle_call_host_ms": round(sorted(one)[10] * 1e3, 4)}
