"""What the tuning-run scripts (run33 onwards) share: one JSON line per measurement, printed and
appended to ``$OUT/<run>.jsonl``; kernels compiled in parallel processes before anything is
timed (a cold H200 machine spends minutes compiling); and a kernel module rebuilt from its source
text with pieces replaced (knock-outs and variants, for timing only)."""
import functools
import importlib.util
import json
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor

OUT = os.environ.get("OUT", "/tmp")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def variant_module(name, path="kda/kernels/chunk_intra.py", replacements=(), transform=None):
    """The module at ``path`` (relative to the repository) with each ``(text, new)`` of
    ``replacements`` applied (every ``text`` must occur exactly once), then ``transform(source)``
    if given (for a change of every occurrence of something)."""
    src = open(os.path.join(ROOT, path)).read()
    for text, new in replacements:
        assert src.count(text) == 1, f"{name}: {text[:60]!r}"
        src = src.replace(text, new)
    if transform is not None:
        src = transform(src)
    out = os.path.join("/tmp", f"{os.path.splitext(os.path.basename(path))[0]}_{name}.py")
    open(out, "w").write(src)
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(out))[0], out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def try_compile(get_fn, params):
    """Compile ``get_fn()(**params)`` for this machine's GPU; ``{"s": seconds, "error": None or
    text}`` (building the variant module counts as part of the compile)."""
    from kda.kernels.build import compile_program
    t = time.time()
    try:
        compile_program(get_fn(), (), **params)
        return {"s": round(time.time() - t, 1), "error": None}
    except Exception as e:  # noqa: BLE001
        return {"s": round(time.time() - t, 1), "error": repr(e)[-400:]}


def compile_in_processes(run, n, compile_one):
    """``compile_one(i)`` for ``i < n`` in ``n`` spawned processes; each returned row is logged."""
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        for row in ex.map(compile_one, range(n)):
            log(run, row)


def each_in_process(run, names, target, limit_s):
    """``target(name)`` for each of ``names`` in a spawned process of its own, ``limit_s`` seconds at
    most: a hand-made pipeline that deadlocks hangs its own process, not the run (run 61's second
    call lost its timings to one). A process that runs out of time is killed and logged."""
    for name in names:
        p = mp.get_context("spawn").Process(target=target, args=(name,))
        p.start()
        p.join(limit_s)
        if p.is_alive():
            p.kill()
            log(run, {"what": "hang", "variant": name, "limit_s": limit_s})


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


def kda_inputs(B, T, H, D):
    """The level-5 benchmark inputs: bf16 ``q, v`` and unit-row ``k``, float32 gates
    ``logsigmoid(x)``, ``beta`` uniform in ``[0, 1]`` (float32)."""
    import torch

    from kda.bench import random_qkv
    from kda.reference import level4 as ref4

    q, k, v = random_qkv(B, T, H, D, D)
    k = ref4.l2_normalize(k.float()).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
    beta = torch.rand(B, T, H, device="cuda")
    return q, k, v, g, beta


def intra_outputs(q, v, C=64):
    """Uninitialised outputs of ``chunk_intra`` for these inputs: ``Qw, Kw, decay, A_qk, W, U``."""
    import torch

    B, T, H, D = q.shape
    new = lambda shape, dt=q.dtype: torch.empty(shape, dtype=dt, device=q.device)
    return [new(q.shape), new(q.shape), new((B, H, -(-T // C), D), torch.float32), new((B, T, H, C)), new(q.shape),
            new(v.shape)]


def chunk_form(B, T, H, D):
    """What the level-5 state pass reads (``prepare_chunks`` of ``kda_inputs``), and the inputs."""
    from kda.kernels.chunk_intra import prepare_chunks
    q, k, v, g, beta = kda_inputs(B, T, H, D)
    return prepare_chunks(q, k, v, g, beta, D ** -0.5), (q, k, v, g, beta)


def state_pass_launch(fn, params, form, h0):
    """A state-pass factory compiled for ``form`` (bf16), with its outputs poisoned with NaN:
    ``(o, ht, launch)``."""
    import torch

    from kda.kernels.build import compile_program
    B, T, H, DK = form.Qw.shape
    DV = form.U.shape[-1]
    kern = compile_program(fn, (), DK=DK, DV=DV, dtype="bfloat16", **params)
    o = torch.full((B, T, H, DV), float("nan"), dtype=form.U.dtype, device="cuda")
    ht = torch.full((B, H, DK, DV), float("nan"), dtype=torch.float32, device="cuda")
    return o, ht, lambda: kern(*form, h0, o, ht)


def check_state_passes(run, factory, names, shapes):
    """O and ht of each pass (``factory(name) -> (fn, params)``) against the first of ``names``, on
    one chunk form per shape and a ragged one with a random initial state; one row per pass."""
    import torch

    from kda.metrics import rel_l2
    for B, T, H, D in list(shapes) + [(2, 1000, 4, 128)]:
        form, _ = chunk_form(B, T, H, D)
        h0 = torch.randn(B, H, D, D, device="cuda") * (T < 2000)
        outs = {}
        for name in names:
            o, ht, launch = state_pass_launch(*factory(name), form, h0)
            launch()
            torch.cuda.synchronize()
            outs[name] = (o, ht)
        o_ref, ht_ref = outs[names[0]]
        for name, (o, ht) in outs.items():
            log(run, {"check": name, "shape": [B, T, H, D], "nan": bool(o.isnan().any() or ht.isnan().any()),
                      "o_rel": rel_l2(o, o_ref), "ht_rel": rel_l2(ht, ht_ref)})


# --- chunk_intra variants (runs 43 onwards): source replacements in kda/kernels/chunk_intra.py ---

INTRA_SHAPES = [(1, 8192, 96, 128), (4, 4096, 64, 128), (1, 32768, 32, 128)]


def intra_module(name, replacements=(), transform=None):
    """``kda/kernels/chunk_intra.py`` with a variant's replacements, under a file name made of ``name``."""
    return variant_module("".join(c if c.isalnum() else "_" for c in name), replacements=replacements,
                          transform=transform)


def intra_gates(shape, kind):
    """Gates ``logsigmoid(x)`` (every chunk takes the middle-row GEMM) or KDA-style
    ``-2 softplus(x)`` (nine chunks in ten take 16-row sub-chunks), ``x ~ N(0, 1)``."""
    import torch
    x = torch.randn(*shape, device="cuda")
    return torch.nn.functional.logsigmoid(x) if kind == "logsigmoid" else -2 * torch.nn.functional.softplus(x)


def compile_intra_variant(names, module, i):
    """Compile variant ``names[i]`` of ``chunk_intra`` (bf16, D = 128) for this machine's GPU."""
    import sys
    sys.path.insert(0, ROOT)
    return {"compile": names[i], **try_compile(lambda: module(names[i]).chunk_intra,
                                                dict(DK=128, DV=128, dtype="bfloat16"))}


def check_intra_variants(run, names, module):
    """Every output of each variant against the first (rel. L2, outputs poisoned with NaN) at
    (1, 4096, 32, 128) and the ragged (2, 1000, 4, 128), both gate kinds; at the ragged shape also
    the output through the state pass of record against the float64 recurrence."""
    import torch

    from kda.kernels.chunk_intra import ChunkForm
    from kda.kernels.gated_state_pass import run_state_pass
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    outputs = ["Qw", "Kw", "decay", "A_qk", "W", "U"]
    mods = {name: module(name) for name in names}
    for B, T, H, D in [(1, 4096, 32, 128), (2, 1000, 4, 128)]:
        q, k, v, _, beta = kda_inputs(B, T, H, D)
        for kind in ("logsigmoid", "-2 softplus"):
            g = intra_gates((B, T, H, D), kind)
            first = None
            for name, mod in mods.items():
                kern = compile_program(mod.chunk_intra, (), DK=D, DV=D, dtype="bfloat16")
                outs = intra_outputs(q, v)
                for o in outs:
                    o.fill_(float("nan"))
                flags = torch.zeros(2, dtype=torch.int32, device="cuda")
                kern(q, k, v, g, beta, D ** -0.5, *outs, flags)
                torch.cuda.synchronize()
                first = outs if first is None else first
                row = {"check": name, "shape": [B, T, H, D], "gate": kind, "flags": flags.tolist(),
                       "nan": any(bool(o.isnan().any()) for o in outs),
                       **{n: float(rel_l2(o.double(), r.double())) for n, o, r in zip(outputs, outs, first)}}
                if T == 1000:
                    o, _ = run_state_pass(ChunkForm(outs[0], outs[1], outs[4], outs[5], outs[3], outs[2]), None)
                    h0 = torch.zeros(B, H, D, D, device="cuda")
                    o_ref, _ = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
                    row["o_vs_float64"] = float(rel_l2(o, o_ref))
                log(run, row)


def time_intra_variants(run, names, module):
    """``chunk_intra`` of each variant at (1, 32768, 32, 128) under both gate kinds, then
    ``chunk_kda`` (``check_values=False``) with each at the three benchmark shapes."""
    import torch

    from kda import chunk_kda
    from kda.bench import median_ms
    from kda.kernels import chunk_intra as stage
    from kda.kernels.build import compile_program
    B, T, H, D = 1, 32768, 32, 128
    q, k, v, _, beta = kda_inputs(B, T, H, D)
    outs = intra_outputs(q, v)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    for kind in ("logsigmoid", "-2 softplus"):
        g = intra_gates((B, T, H, D), kind)
        for name in names:
            kern = compile_program(module(name).chunk_intra, (), DK=D, DV=D, dtype="bfloat16")
            log(run, {"what": "chunk_intra", "variant": name, "gate": kind,
                      "ms": median_ms(lambda: kern(q, k, v, g, beta, D ** -0.5, *outs, flags))})
    del q, k, v, beta, outs, g
    adopted = stage.chunk_intra
    for shape in INTRA_SHAPES:
        q, k, v, g, beta = kda_inputs(*shape)
        for name in names:
            stage.chunk_intra = module(name).chunk_intra
            log(run, {"what": "chunk_kda", "variant": name, "shape": list(shape), "check_values": False,
                      "ms": median_ms(lambda: chunk_kda(q, k, v, g, beta, check_values=False))})
        stage.chunk_intra = adopted
        del q, k, v, g, beta
        torch.cuda.empty_cache()


def replaced(variants):
    """``module(name)`` for a table ``{name: source replacements}`` of ``chunk_intra`` variants
    (a partial, so that the spawned compile processes can unpickle it)."""
    return functools.partial(_replaced_module, variants)


def _replaced_module(variants, name):
    return intra_module(name, variants[name])


def run_intra_variants(run, names, module, argv):
    """The command line of a ``chunk_intra`` variants script: ``compile`` (each variant in a spawned
    process), ``check``, ``time``, as asked. ``module(name)`` builds a variant's module; defined at
    the top of the script or made by ``replaced``, so that the compile processes can import it."""
    import sys
    sys.path.insert(0, ROOT)
    if "compile" in argv:
        compile_in_processes(run, len(names), functools.partial(compile_intra_variant, names, module))
    if "check" in argv:
        check_intra_variants(run, names, module)
    if "time" in argv:
        time_intra_variants(run, names, module)


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
