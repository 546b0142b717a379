"""Variants of the level-3 kernels at the headline shape, timed side by side."""
# (as run: `l3var` = run11-level3-variants-kernel.py, `l2var.l2_branchfree` = kda/kernels/level2.py with run12-level2-branchfree.diff applied)
import json, os, sys, time, traceback
sys.path.insert(0, os.path.join(os.getcwd(), ".scratch"))
import torch
from kda.bench import median_ms, random_qkv
from kda.kernels.build import compile_program
from kda.kernels import level3 as K3, level2 as K2
import l3var, l2var
OUT = os.environ.get("OUT", "/tmp"); res = {}
B, T, H, D = 1, 32768, 32, 128
q, k, v = random_qkv(B, T, H, D, D)
gs = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
gc = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
G = torch.empty(B, H, T, device="cuda"); cs = compile_program(K3.chunk_cumsum, (), D=1); cs(gs.view(B, T, H, 1), G.view(B, H, T, 1))
o = torch.empty_like(v); sc = D ** -0.5
cands = {}
for skip in []:
    ker = compile_program(l3var.scalar_variant, (), DK=D, DV=D, skip=skip)
    cands["scalar_skip_" + "+".join(skip)] = (lambda ker=ker: ker(q, k, v, G, sc, o))
l2 = compile_program(K2.seq_in_loop, (), DK=D, DV=D); la = torch.full((H,), -0.1, device="cuda")
cands["level2"] = lambda: l2(q, k, v, la, sc, o)
l2b = compile_program(l2var.l2_branchfree, (), DK=D, DV=D)
cands["level2_branchfree"] = lambda: l2b(q, k, v, la, sc, o)
o2 = torch.empty_like(v); l2(q, k, v, la, sc, o); l2b(q, k, v, la, sc, o2); res["level2_branchfree_equal"] = bool(torch.equal(o, o2))
for thr in (256,):
    try:
        prep = compile_program(K3.chunk_prepare, (), DK=D, threads=thr)
        outs = [torch.empty(B, T, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(2)] + [torch.empty(B, H, T // 64, D, device="cuda"), torch.empty(B, T, H, 64, dtype=torch.bfloat16, device="cuda")]
        cands[f"prepare_t{thr}"] = (lambda prep=prep, outs=outs: prep(q, k, gc, sc, *outs))
        cands[f"prepare_t{thr}_steep"] = (lambda prep=prep, outs=outs: prep(q, k, gc * 20, sc, *outs))
    except Exception:
        res[f"prepare_t{thr}"] = traceback.format_exc()[-400:]
for name, fn in cands.items():
    try: res[name] = median_ms(fn)
    except Exception: res[name] = traceback.format_exc()[-400:]
    print(name, res[name], flush=True); json.dump(res, open(f"{OUT}/l3time.json", "w"), indent=1)
