"""Level 4 on the GPU: headline timings vs fla chunk_delta_rule, stage variants."""
import json, os, traceback
import torch
import kda, kda.delta
kda.delta.CUDA_KERNELS_CHECKED = True
from kda.metrics import rel_l2
from kda.reference import level4 as ref4
from kda.bench import median_ms, random_qkv
from kda.kernels import level4 as K4
from kda.kernels.build import compile_program
OUT = os.environ.get("OUT", "/tmp")
res = {"times": {}, "stages": {}}
dump = lambda: json.dump(res, open(f"{OUT}/l4check.json", "w"), indent=1)
from fla.ops.delta_rule import chunk_delta_rule
B, T, H, D = 1, 32768, 32, 128
q, k, v = random_qkv(B, T, H, D, D)
k = ref4.l2_normalize(k.float()).bfloat16()
beta = torch.rand(B, T, H, device="cuda").bfloat16()
cands = {"kda": lambda: kda.delta_rule(q, k, v, beta),
         "kda_nocheck": lambda: kda.delta_rule(q, k, v, beta, check_beta=False),
         "fla": lambda: chunk_delta_rule(q, k, v, beta, scale=D ** -0.5)[0]}
res["agree_vs_fla"] = rel_l2(cands["kda"]().float(), cands["fla"]().double())
print("agree", res["agree_vs_fla"])
for name, fn in cands.items():
    try: res["times"][name] = median_ms(fn)
    except Exception: res["times"][name] = traceback.format_exc()[-500:]
    print(name, res["times"][name], flush=True); dump()
C, NC = 64, T // 64
W, U = torch.empty_like(k), torch.empty_like(v)
Ainv = torch.empty(B, T, H, C, device="cuda")
h = torch.empty(B, NC, H, D, D, dtype=q.dtype, device="cuda")
v_new, o = torch.empty_like(v), torch.empty_like(v)
h0, ht = torch.zeros(B, H, D, D, device="cuda"), torch.empty(B, H, D, D, device="cuda")
betaf = beta.float()
st = {"wy_products": (K4.chunk_wy, {}, lambda f: f(k, v, betaf, W, U)),
      "wy_substitution": (K4.chunk_wy, dict(merge="substitution"), lambda f: f(k, v, betaf, W, U)),
      "wy_products_inverse": (K4.chunk_wy, dict(write_inverse=True), lambda f: f(k, v, betaf, W, U, Ainv)),
      "state_pass": (K4.state_pass, {}, lambda f: f(k, W, U, h0, h, v_new, ht)),
      "chunk_output": (K4.chunk_output, {}, lambda f: f(q, k, h, v_new, D ** -0.5, o))}
for bdv, ns in ((32, 3), (16, 3), (64, 2), (32, 2)):
    st[f"fused_bdv{bdv}_ns{ns}"] = (K4.state_output_pass, dict(block_dv=bdv, num_stages=ns), lambda f: f(q, k, W, U, h0, D ** -0.5, o, ht))
for name, (fn, kw, call) in st.items():
    try:
        kern = compile_program(fn, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16", **kw)
        res["stages"][name] = median_ms(lambda: call(kern))
    except Exception:
        res["stages"][name] = traceback.format_exc()[-800:]
    print(name, res["stages"][name], flush=True); dump()
