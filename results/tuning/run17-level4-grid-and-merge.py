import json, os, sys, traceback, importlib.util
import torch
sys.path.insert(0, ".scratch")
import k4var as K
from kda.bench import median_ms, random_qkv
from kda.reference import level4 as ref4
from kda.metrics import rel_l2
from kda.kernels.build import compile_program
OUT = os.environ.get("OUT", "/tmp")
res = {}
B, T, H, D, C = 1, 32768, 32, 128, 64
q, k, v = random_qkv(B, T, H, D, D)
k = ref4.l2_normalize(k.float()).bfloat16()
beta = torch.rand(B, T, H, device="cuda")
W, U = torch.empty_like(k), torch.empty_like(v)
W0, U0 = torch.empty_like(k), torch.empty_like(v)
compile_program(K.chunk_wy, (), DK=D, DV=D, dtype="bfloat16", merge="substitution", grid3=False)(k, v, beta, W0, U0)
variants = {
 "sub_grid2": (K.chunk_wy, dict(merge="substitution", grid3=False)),
 "sub_grid3": (K.chunk_wy, dict(merge="substitution")),
 "prod_grid3": (K.chunk_wy, dict(merge="products")),
 "none_grid3": (K.chunk_wy, dict(merge="none")),
 "prod_grid3_t256": (K.chunk_wy, dict(merge="products", threads=256)),
 "copy_probe": (K.copy_probe, {}),
}
for name, (fn, kw) in variants.items():
    try:
        kern = compile_program(fn, (), DK=D, DV=D, dtype="bfloat16", **kw)
        W.fill_(float("nan")); U.fill_(float("nan"))
        kern(k, v, beta, W, U) if fn is K.chunk_wy else kern(k, v, W, U)
        res[name] = dict(ms=median_ms(lambda: kern(k, v, beta, W, U) if fn is K.chunk_wy else kern(k, v, W, U)),
                         errW=rel_l2(W, W0), errU=rel_l2(U, U0))
    except Exception:
        res[name] = traceback.format_exc()[-600:]
    print(name, res[name], flush=True)
    json.dump(res, open(f"{OUT}/wyvar.json", "w"), indent=1)
h = torch.randn(B, T // C, H, D, D, device="cuda").bfloat16()
o = torch.empty_like(v)
for g3 in (False, True):
    kern = compile_program(K.chunk_output, (), DK=D, DV=D, dtype="bfloat16", grid3=g3)
    res[f"output_grid3={g3}"] = median_ms(lambda: kern(q, k, h, v, 0.1, o))
    print(g3, res[f"output_grid3={g3}"], flush=True)
json.dump(res, open(f"{OUT}/wyvar.json", "w"), indent=1)
