"""Exploratory: config sweep of the level 1/2 fused kernels vs fla at the headline shape."""
import itertools, json, os, sys, time, traceback
from concurrent.futures import ProcessPoolExecutor
import torch
OUT = os.environ.get("OUT", "/tmp")
LOG = open(os.path.join(OUT, "sweep.jsonl"), "a")
def log(**kw):
    print(json.dumps(kw), flush=True); LOG.write(json.dumps(kw) + "\n"); LOG.flush()

from kda.kernels import level1 as k1, level2 as k2
from kda.kernels.build import compile_program, ptxas_report
H, D = 32, 128
configs = []
for bdv, st, th in itertools.product([16, 32, 64], [1, 2], [128, 256]):
    configs.append((1, dict(block_dv=bdv, num_stages=st, threads=th)))
for bdv, th in itertools.product([16, 32, 64], [128, 256]):
    configs.append((2, dict(block_dv=bdv, num_stages=2, threads=th)))

def build(item):
    lvl, cfg = item
    fn = k1.seq_in_loop if lvl == 1 else k2.seq_in_loop
    t = time.time()
    try:
        kern = compile_program(fn, (), DK=D, DV=D, dtype="bfloat16", with_state=False, chunk_size=64, **cfg)
        return lvl, cfg, time.time() - t, ptxas_report(kern), None
    except Exception as e:
        return lvl, cfg, time.time() - t, None, repr(e)[-300:]

if __name__ == "__main__":
    t0 = time.time()
    with ProcessPoolExecutor(8) as ex:
        for lvl, cfg, dt, rep, err in ex.map(build, configs):
            log(stage="compile", level=lvl, cfg=cfg, seconds=round(dt, 1), ptxas=rep, error=err)
    log(stage="compiled_all", seconds=round(time.time() - t0, 1))
    from kda.bench import median_ms, random_qkv, fla_linear_attention, fla_decay_attention
    from kda.reference import level1 as r1, level2 as r2
    from kda.metrics import rel_l2
    from kda import ledger
    T = 32768
    q, k, v = random_qkv(1, T, H, D, D)
    scale = D ** -0.5
    floor = ledger.floor_seconds(ledger.forward_flops(1, T, H, D, D), ledger.forward_min_bytes(1, T, H, D, D)) * 1e3
    log(stage="floor_ms", value=floor)
    qs, ks, vs = random_qkv(2, 333, 4, D, D, seed=1)
    la = torch.tensor([0.9] * 4, device="cuda")
    refs = {1: r1.chunked(qs.double() * scale, ks, vs)[0], 2: r2.chunked(qs.double() * scale, ks, vs, la)[0]}
    lg = torch.log2(torch.full((H,), 0.99, device="cuda"))
    for lvl, cfg in configs:
        fn = k1.seq_in_loop if lvl == 1 else k2.seq_in_loop
        try:
            kern = compile_program(fn, (), DK=D, DV=D, dtype="bfloat16", with_state=False, chunk_size=64, **cfg)
            kern_s = compile_program(fn, (), DK=D, DV=D, dtype="bfloat16", with_state=False, chunk_size=64, **cfg)
            os_ = torch.full_like(vs, float("nan"))
            extra = () if lvl == 1 else (torch.log2(la),)
            kern_s(qs, ks, vs, *extra, scale, os_)
            err = rel_l2(os_, refs[lvl])
            o = torch.empty_like(v)
            extra = () if lvl == 1 else (lg,)
            ms = median_ms(lambda: kern(q, k, v, *extra, scale, o))
            log(stage="time", level=lvl, cfg=cfg, ms=ms, err=err, floor_frac=floor / ms)
        except Exception as e:
            log(stage="time", level=lvl, cfg=cfg, error=repr(e)[-500:])
    try:
        t = time.time(); fla_linear_attention(q, k, v, scale); torch.cuda.synchronize()
        log(stage="fla_warm", level=1, seconds=time.time() - t)
        ms = median_ms(lambda: fla_linear_attention(q, k, v, scale))
        err = rel_l2(fla_linear_attention(qs, ks, vs, scale), refs[1])
        log(stage="fla", level=1, ms=ms, err=err)
        g = torch.full((H,), 0.99)
        t = time.time(); fla_decay_attention(q, k, v, g, scale); torch.cuda.synchronize()
        log(stage="fla_warm", level=2, seconds=time.time() - t)
        ms = median_ms(lambda: fla_decay_attention(q, k, v, g, scale))
        err = rel_l2(fla_decay_attention(qs, ks, vs, torch.full((4,), 0.9), scale), refs[2])
        log(stage="fla", level=2, ms=ms, err=err)
    except Exception:
        log(stage="fla", error=traceback.format_exc()[-1500:])
