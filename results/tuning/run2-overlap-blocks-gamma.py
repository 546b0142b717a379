"""Exploratory 2: overlap / two blocks per SM / Gamma table, headline shape, no fla."""
import json, multiprocessing as mp, os, time
from concurrent.futures import ProcessPoolExecutor
OUT = os.environ.get("OUT", "/tmp")
LOG = open(os.path.join(OUT, "sweep2.jsonl"), "a")
def log(**kw):
    print(json.dumps(kw), flush=True); LOG.write(json.dumps(kw) + "\n"); LOG.flush()
D = 128
base = dict(num_stages=2, threads=128, chunk_size=64)
V1 = [dict(block_dv=32), dict(block_dv=32, overlap_gemms=True), dict(block_dv=16, overlap_gemms=True, min_blocks=2),
      dict(block_dv=16, min_blocks=2), dict(block_dv=32, overlap_gemms=True, min_blocks=2), dict(block_dv=64, overlap_gemms=True)]
V2 = [dict(block_dv=32), dict(block_dv=32, gamma_table=True), dict(block_dv=32, gamma_table=True, overlap_gemms=True),
      dict(block_dv=16, gamma_table=True, overlap_gemms=True, min_blocks=2), dict(block_dv=16, overlap_gemms=True, min_blocks=2),
      dict(block_dv=32, gamma_table=True, overlap_gemms=True, min_blocks=2)]
ITEMS = [(1, v) for v in V1] + [(2, v) for v in V2]
def build(item):
    from kda.kernels import level1 as k1, level2 as k2
    from kda.kernels.build import compile_program
    lvl, cfg = item
    t = time.time()
    try:
        compile_program(k1.seq_in_loop if lvl == 1 else k2.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", with_state=False, **base, **cfg)
        return lvl, cfg, time.time() - t, None
    except Exception as e:
        return lvl, cfg, time.time() - t, repr(e)[-300:]
if __name__ == "__main__":
    t0 = time.time()
    with ProcessPoolExecutor(12, mp_context=mp.get_context("spawn")) as ex:
        for lvl, cfg, dt, err in ex.map(build, ITEMS):
            log(stage="compile", level=lvl, cfg=cfg, seconds=round(dt, 1), error=err)
    log(stage="compiled_all", seconds=round(time.time() - t0, 1))
    import torch
    from kda.kernels import level1 as k1, level2 as k2
    from kda.kernels.build import compile_program
    from kda.bench import median_ms, random_qkv
    from kda.reference import level1 as r1, level2 as r2
    from kda.metrics import rel_l2
    from kda import ledger
    # ceilings
    x = torch.empty(2**31, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x)); log(stage="ceiling_copy_TBps", value=2 * x.numel() / ms / 1e9)
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    ms = median_ms(lambda: a @ b); log(stage="ceiling_bf16_TFLOPs", value=2 * 8192**3 / ms / 1e9)
    del a, b
    H = 32
    scale = D ** -0.5
    qs, ks, vs = random_qkv(2, 333, 4, D, D, seed=1)
    la = torch.tensor([0.9, 0.5, 1.0, 0.99], device="cuda")
    refs = {1: r1.chunked(qs.double() * scale, ks, vs)[0], 2: r2.chunked(qs.double() * scale, ks, vs, la)[0]}
    for T in (32768, 8192):
        q, k, v = random_qkv(1, T, H, D, D)
        floor = ledger.floor_seconds(ledger.forward_flops(1, T, H, D, D), ledger.forward_min_bytes(1, T, H, D, D)) * 1e3
        lg = torch.log2(torch.full((H,), 0.99, device="cuda"))
        for lvl, cfg in ITEMS:
            try:
                kern = compile_program(k1.seq_in_loop if lvl == 1 else k2.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", with_state=False, **base, **cfg)
                o = torch.full_like(vs, float("nan"))
                kern(qs, ks, vs, *(() if lvl == 1 else (torch.log2(la),)), scale, o)
                err = rel_l2(o, refs[lvl])
                o = torch.empty_like(v)
                extra = () if lvl == 1 else (lg,)
                ms = median_ms(lambda: kern(q, k, v, *extra, scale, o))
                ms2 = median_ms(lambda: kern(q, k, v, *extra, scale, o))
                log(stage="time", T=T, level=lvl, cfg=cfg, ms=round(ms, 4), ms_again=round(ms2, 4), err=err, floor_ms=round(floor, 4))
            except Exception as e:
                log(stage="time", T=T, level=lvl, cfg=cfg, error=repr(e)[-400:])
