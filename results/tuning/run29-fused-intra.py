"""Run 29 (H200): the fused level-5 intra-chunk kernel (kda.kernels.level5.chunk_intra).

Compiles every variant in parallel processes first, then times, in one process on the same
inputs: kda.chunk_kda and fla's chunk_kda at the issue's three shapes; chunk_intra at three
launch configurations; the state pass at three configurations; level 3's per-channel prepare
(old chunk_prepare vs chunk_intra without the delta rule) and fla's chunk_gla. Writes one JSON
line per measurement to $OUT/run29.jsonl as it goes.

    python results/tuning/run29-fused-intra.py compile        # parallel compile only
    python results/tuning/run29-fused-intra.py compile time   # compile, then time
"""
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]
INTRA = [dict(threads=256, min_blocks=2), dict(threads=256, min_blocks=1), dict(threads=128, min_blocks=1)]
PASS = [dict(block_dv=32, num_stages=2), dict(block_dv=64, num_stages=2), dict(block_dv=32, num_stages=3)]
OUT = os.environ.get("OUT", "/tmp")


def kernels():
    from kda.kernels import level3, level5
    out = [(level5.chunk_intra, dict(DK=128, DV=128, dtype="bfloat16", **c)) for c in INTRA]
    out += [(level5.chunk_intra, dict(DK=128, DV=128, dtype="bfloat16", delta=False, threads=256, min_blocks=2))]
    out += [(level5.gated_state_output_pass, dict(DK=128, DV=128, dtype="bfloat16", **c)) for c in PASS]
    out += [(level3.chunk_prepare, dict(DK=128, dtype="bfloat16", gate_dtype="float32"))]
    out += [(level3.seq_in_loop_per_channel, dict(DK=128, DV=128, dtype="bfloat16", block_dv=32, num_stages=3,
                                                  threads=128))]
    # what the GPU tests compile
    for dt in ("bfloat16", "float16"):
        for DK, DV in ((64, 128), (128, 64), (128, 128), (64, 64)):
            for delta in (True, False):
                cfg = dict(threads=256, min_blocks=2) if dt == "bfloat16" else {}
                out.append((level5.chunk_intra, dict(DK=DK, DV=DV, dtype=dt, delta=delta, **cfg)))
            out.append((level5.gated_state_output_pass, dict(DK=DK, DV=DV, dtype=dt)))
    return out


def compile_one(i):
    from kda.kernels.build import compile_program
    fn, params = kernels()[i]
    t = time.time()
    try:
        compile_program(fn, (), **params)
        return fn.__name__, params, round(time.time() - t, 1), None
    except Exception as e:  # noqa: BLE001
        return fn.__name__, params, round(time.time() - t, 1), repr(e)[-400:]


def log(row):
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "run29.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def compile_all():
    import multiprocessing as mp
    n = len(kernels())
    with ProcessPoolExecutor(max_workers=min(14, n), mp_context=mp.get_context("spawn")) as ex:
        for name, params, secs, err in ex.map(compile_one, range(n)):
            log({"compile": name, "params": params, "s": secs, "error": err})


def time_all():
    import torch
    from kda import chunk_kda
    from kda.bench import median_ms, random_qkv
    from kda.kernels import level3, level5
    from kda.kernels.build import compile_program
    from kda.reference import level4 as ref4
    from fla.ops.kda import chunk_kda as fla_kda
    from fla.ops.gla import chunk_gla as fla_gla

    for n, (B, T, H, D) in enumerate(SHAPES):
        variants = n == 0                      # launch variants and level 3 at the headline shape only
        C, NC = 64, T // 64
        scale = D ** -0.5
        q, k, v = random_qkv(B, T, H, D, D, seed=7)
        k = ref4.l2_normalize(k.float()).bfloat16()
        gen = torch.Generator(device="cuda").manual_seed(8)
        beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
        shape = dict(B=B, T=T, H=H, D=D)
        ours = chunk_kda(q, k, v, g, beta)[0]
        theirs = fla_kda(q, k, v, g, beta, scale=scale)[0]
        diff = ((ours.double() - theirs.double()).norm() / theirs.double().norm()).item()
        log({**shape, "what": "chunk_kda", "kda": median_ms(lambda: chunk_kda(q, k, v, g, beta)),
             "fla": median_ms(lambda: fla_kda(q, k, v, g, beta, scale=scale)), "rel_l2_kda_vs_fla": diff})
        beta32 = beta.float()
        e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="cuda")
        Qw, Kw, W, U, o = e(B, T, H, D), e(B, T, H, D), e(B, T, H, D), e(B, T, H, D), e(B, T, H, D)
        decay, A_qk = e(B, H, NC, D, dt=torch.float32), e(B, T, H, C)
        for cfg in (INTRA if variants else INTRA[:1]):
            kern = compile_program(level5.chunk_intra, (), DK=D, DV=D, dtype="bfloat16", **cfg)
            log({**shape, "what": "chunk_intra", **cfg,
                 "ms": median_ms(lambda: kern(q, k, v, g, beta32, scale, Qw, Kw, decay, A_qk, W, U))})
        h0, ht = torch.zeros(B, H, D, D, device="cuda"), e(B, H, D, D, dt=torch.float32)
        for cfg in (PASS if variants else PASS[:1]):
            kern = compile_program(level5.gated_state_output_pass, (), DK=D, DV=D, dtype="bfloat16", **cfg)
            log({**shape, "what": "gated_state_output_pass", **cfg,
                 "ms": median_ms(lambda: kern(Qw, Kw, W, U, A_qk, decay, h0, o, ht))})
        if not variants:
            continue
        # level 3, per-channel gate
        intra3 = compile_program(level5.chunk_intra, (), DK=D, DV=D, dtype="bfloat16", delta=False, threads=256,
                                 min_blocks=2)
        prep3 = compile_program(level3.chunk_prepare, (), DK=D, dtype="bfloat16", gate_dtype="float32")
        seq3 = compile_program(level3.seq_in_loop_per_channel, (), DK=D, DV=D, dtype="bfloat16", block_dv=32,
                               num_stages=3, threads=128)
        log({**shape, "what": "level3",
             "chunk_intra_nodelta": median_ms(lambda: intra3(q, k, g, scale, Qw, Kw, decay, A_qk)),
             "chunk_prepare_old": median_ms(lambda: prep3(q, k, g, scale, Qw, Kw, decay, A_qk)),
             "seq_in_loop_per_channel": median_ms(lambda: seq3(Qw, Kw, A_qk, decay, v, o)),
             "fla_chunk_gla": median_ms(lambda: fla_gla(q, k, v, g, scale=scale)[0])})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if "compile" in sys.argv:
        compile_all()
    if "time" in sys.argv:
        time_all()
