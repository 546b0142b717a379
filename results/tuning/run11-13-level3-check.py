"""Level-3 kernels on the GPU: correctness on a few shapes, then the headline timings."""
import json, os, sys, time, traceback
import torch
import kda, kda.ops
from kda.metrics import rel_l2
from kda.reference import level3 as ref3
from kda.bench import median_ms, random_qkv
OUT = os.environ.get("OUT", "/tmp")
res = {"checks": [], "times": {}}
def dump():
    json.dump(res, open(f"{OUT}/l3check.json", "w"), indent=1)
kda.ops.poison_outputs = True
torch.manual_seed(0)
def gates(shape, kind, dtype=torch.float32):
    if kind == "mild": g = -0.05 * torch.rand(shape, device="cuda")
    elif kind == "logsig": g = torch.nn.functional.logsigmoid(torch.randn(shape, device="cuda"))
    elif kind == "extreme": g = -20 * torch.rand(shape, device="cuda")
    elif kind == "runs":  # long runs of strong decay mixed with none
        g = torch.where((torch.arange(shape[1], device="cuda") // 37 % 3 == 0).view(1, -1, *[1] * (len(shape) - 2)), -20.0, -0.01) * torch.ones(shape, device="cuda")
    return g.to(dtype)
for (B, T, H, DK, DV) in [(2, 200, 3, 64, 128), (1, 1, 2, 64, 64), (1, 1000, 2, 128, 64)]:
    for dtype in (torch.bfloat16, torch.float16):
        for kind in ("mild", "logsig", "extreme", "runs"):
            for pc in (False, True):
                try:
                    q, k, v = random_qkv(B, T, H, DK, DV, dtype, seed=T + DK)
                    g = gates((B, T, H, DK) if pc else (B, T, H), kind)
                    h0 = torch.randn(B, H, DK, DV, device="cuda")
                    o, ht = kda.gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
                    ro, rht = ref3.recurrent(q.double() * DK ** -0.5, k, v, g, h0, True)
                    o2 = kda.gated_attention(q, k, v, g)
                    ro2, _ = ref3.chunked(q.double() * DK ** -0.5, k, v, g)
                    row = dict(shape=(B, T, H, DK, DV), dtype=str(dtype), gate=kind, per_channel=pc,
                               err_o=rel_l2(o, ro), err_ht=rel_l2(ht, rht), err_o_nostate=rel_l2(o2, ro2),
                               nan=bool(torch.isnan(o).any() or torch.isnan(ht).any() or torch.isnan(o2).any()))
                    if pc:
                        Qw, Kw, dec, A = ref3.prepare(q, k, g, DK ** -0.5)
                        from kda.kernels import level3 as K3
                        from kda.kernels.build import compile_program
                        prep = compile_program(K3.chunk_prepare, (), DK=DK, dtype=str(dtype)[6:], gate_dtype="float32")
                        NC = -(-T // 64)
                        out = [torch.full(s, float("nan"), dtype=d, device="cuda") for s, d in (((B, T, H, DK), dtype), ((B, T, H, DK), dtype), ((B, H, NC, DK), torch.float32), ((B, T, H, 64), dtype))]
                        prep(q, k, g, DK ** -0.5, *out)
                        from kda.reference._common import from_chunks
                        Ak = out[3]; Ar = from_chunks(A, T)
                        row["err_A"] = rel_l2(Ak, Ar)
                        row["err_Qw"] = rel_l2(out[0], from_chunks(Qw, T)); row["err_Kw"] = rel_l2(out[1], from_chunks(Kw, T))
                        row["err_decay"] = rel_l2(out[2], dec)
                except Exception as e:
                    row = dict(shape=(B, T, H, DK, DV), gate=kind, per_channel=pc, error=traceback.format_exc()[-800:])
                print(row, flush=True)
                res["checks"].append(row); dump()
# timings
from fla.ops.simple_gla import chunk_simple_gla
from fla.ops.gla import chunk_gla
B, T, H, D = 1, 32768, 32, 128
q, k, v = random_qkv(B, T, H, D, D)
kda.ops.poison_outputs = False
gs = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
gc = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda"))
sc = D ** -0.5
cands = {
 "kda_scalar_nocheck": lambda: kda.gated_attention(q, k, v, gs, check_gates=False),
 "fla_simple_gla": lambda: chunk_simple_gla(q, k, v, g=gs, scale=sc)[0],
 "kda_channel_nocheck": lambda: kda.gated_attention(q, k, v, gc, check_gates=False),
 "kda_channel": lambda: kda.gated_attention(q, k, v, gc),
 "fla_gla": lambda: chunk_gla(q, k, v, g=gc, scale=sc)[0],
}
from kda.kernels import level3 as K3
from kda.kernels.build import compile_program
prep = compile_program(K3.chunk_prepare, (), DK=D, dtype="bfloat16", gate_dtype="float32")
outs = [torch.empty(B, T, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(2)] + [torch.empty(B, H, T // 64, D, device="cuda"), torch.empty(B, T, H, 64, dtype=torch.bfloat16, device="cuda")]
cands["stage_prepare"] = lambda: prep(q, k, gc, sc, *outs)
gsteep = gc * 20
cands["stage_prepare_steep"] = lambda: prep(q, k, gsteep, sc, *outs)
seq = compile_program(K3.seq_in_loop_per_channel, (), DK=D, DV=D)
o = torch.empty_like(v)
cands["stage_seq_channel"] = lambda: seq(outs[0], outs[1], outs[3], outs[2], v, o)
la = torch.full((H,), 0.9)
cands["level2_api"] = lambda: kda.decay_attention(q, k, v, la)
ref_s = chunk_simple_gla(q, k, v, g=gs, scale=sc)[0]
res["agree_scalar_vs_fla"] = rel_l2(kda.gated_attention(q, k, v, gs).float(), ref_s.double())
ref_c = chunk_gla(q, k, v, g=gc, scale=sc)[0]
res["agree_channel_vs_fla"] = rel_l2(kda.gated_attention(q, k, v, gc).float(), ref_c.double())
dump()
for name, fn in cands.items():
    try:
        res["times"][name] = median_ms(fn)
    except Exception:
        res["times"][name] = traceback.format_exc()[-500:]
    print(name, res["times"][name], flush=True); dump()
