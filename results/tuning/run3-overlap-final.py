import json, multiprocessing as mp, os, time
from concurrent.futures import ProcessPoolExecutor
OUT = os.environ.get("OUT", "/tmp")
LOG = open(os.path.join(OUT, "sweep3.jsonl"), "a")
def log(**kw):
    print(json.dumps(kw), flush=True); LOG.write(json.dumps(kw) + "\n"); LOG.flush()
D = 128
ITEMS = [(l, dict(overlap_gemms=o, block_dv=b)) for l in (1, 2) for o in (True, False) for b in (32, 64)]
def build(item):
    from kda.kernels import level1 as k1, level2 as k2
    from kda.kernels.build import compile_program
    lvl, cfg = item
    compile_program(k1.seq_in_loop if lvl == 1 else k2.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", **cfg)
    return item
if __name__ == "__main__":
    with ProcessPoolExecutor(8, mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(build, ITEMS))
    import torch
    from kda.kernels import level1 as k1, level2 as k2
    from kda.kernels.build import compile_program
    from kda.bench import median_ms, random_qkv
    from kda.reference import level1 as r1, level2 as r2
    from kda.metrics import rel_l2
    scale = D ** -0.5
    qs, ks, vs = random_qkv(2, 333, 4, D, D, seed=1)
    la = torch.tensor([0.9, 0.5, 1.0, 0.99], device="cuda")
    refs = {1: r1.chunked(qs.double() * scale, ks, vs)[0], 2: r2.chunked(qs.double() * scale, ks, vs, la)[0]}
    H = 32
    for T in (32768, 8192):
        q, k, v = random_qkv(1, T, H, D, D)
        lg = torch.log2(torch.full((H,), 0.99, device="cuda"))
        for lvl, cfg in ITEMS:
            kern = compile_program(k1.seq_in_loop if lvl == 1 else k2.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", **cfg)
            o = torch.full_like(vs, float("nan"))
            kern(qs, ks, vs, *(() if lvl == 1 else (torch.log2(la),)), scale, o)
            err = rel_l2(o, refs[lvl])
            o = torch.empty_like(v)
            extra = () if lvl == 1 else (lg,)
            ms = [median_ms(lambda: kern(q, k, v, *extra, scale, o)) for _ in range(3)]
            log(T=T, level=lvl, cfg=cfg, ms=[round(m, 4) for m in ms], err=err)
