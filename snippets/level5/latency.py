# snippet: gpu
"""Level-5 latency on the H200 at B = 1, T = 32768, H = 32, D = 128, bf16, unit keys, b uniform in
[0, 1], float32 gates logsigmoid(x): KDA against fla's chunk_kda, GDN against fla's
chunk_gated_delta_rule (its own Triton path, FLA_FLASH_QLA=0) and FlashQLA 0.1.3, all in one
process on the same inputs; then each kda stage alone."""
import os

import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.delta import forward_flops
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.kernels import level3, level5
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
from fla.ops.kda import chunk_kda as fla_kda
import flash_qla

assert os.environ.get("FLA_FLASH_QLA") == "0", "run with FLA_FLASH_QLA=0 so that fla's GDN is its own Triton path"
B, T, H, D, C = 1, 32768, 32, 128, 64
SCALE = D ** -0.5
q, k, v = random_qkv(B, T, H, D, D, seed=7)
k = ref.l2_normalize(k.float()).bfloat16()
gen = torch.Generator(device="cuda").manual_seed(8)
beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
g_kda = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
g_gdn = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))

runs = {
    "KDA": {"kda": lambda: chunk_kda(q, k, v, g_kda, beta)[0],
            "fla chunk_kda": lambda: fla_kda(q, k, v, g_kda, beta, scale=SCALE)[0]},
    "GDN": {"kda": lambda: chunk_gated_delta_rule(q, k, v, g_gdn, beta)[0],
            "fla chunk_gated_delta_rule (Triton)": lambda: fla_gdn(q, k, v, g_gdn, beta, scale=SCALE)[0],
            "FlashQLA 0.1.3": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g_gdn, beta, scale=SCALE)[0]},
}
table = Table(["op", "implementation", "ms", "kda faster by", "at % of floor", "rel L2 vs kda"],
              formats=[None, None, "{:.3f}", "{:.2f}x", "{:.0%}", sci])
rows = []
for op, fns in runs.items():
    g = g_kda if op == "KDA" else g_gdn
    nbytes = ledger.forward_min_bytes(B, T, H, D, D) + (g.numel() * g.element_size() + beta.numel() * beta.element_size())
    floor = ledger.floor_seconds(forward_flops(B, T, H, D, D, C), nbytes) * 1e3
    ours = fns["kda"]().double()
    t = {name: median_ms(fn) for name, fn in fns.items()}
    for name, fn in fns.items():
        table.rows.append([op, name, t[name], t[name] / t["kda"], floor / t[name],
                           0.0 if name == "kda" else rel_l2(fn(), ours)])
    rows.append(dict(op=op, T=T, floor=floor, **{name: t[name] for name in fns}))
print(table)
print("\n`kda faster by` = that implementation's time over kda's; the floor counts q, k, v, o, g and beta "
      "once, and the delta rule's FLOPs (kda.delta.forward_flops).")

# each stage alone (KDA, the same inputs)
NC = T // C
build = lambda fn, **kw: compile_program(fn, (), chunk_size=C, dtype="bfloat16", **kw)
prepare_out = build(level3.chunk_prepare, DK=D, gate_dtype="float32")
prepare_kk = build(level3.chunk_prepare, DK=D, gate_dtype="float32", score_dtype="float32")
wy = build(level5.chunk_wy_gated, DK=D, DV=D)
state_pass = build(level5.gated_state_output_pass, DK=D, DV=D)
Qw, Kw, Kg, W, U, o = (torch.empty_like(q) for _ in range(6))
decay = torch.empty(B, H, NC, D, device="cuda")
A_qk, A_kk = torch.empty(B, T, H, C, dtype=q.dtype, device="cuda"), torch.empty(B, T, H, C, device="cuda")
h0, ht = torch.zeros(B, H, D, D, device="cuda"), torch.empty(B, H, D, D, device="cuda")
beta32 = beta.float()
stages = Table(["stage", "what it does", "ms"], formats=[None, None, "{:.3f}"])
for name, what, fn in [
    ("chunk_prepare (Q, K)", "gate cumsum, Qw, Kw, decay, A_qk by sub-chunks",
     lambda: prepare_out(q, k, g_kda, SCALE, Qw, Kw, decay, A_qk)),
    ("chunk_prepare (K, K)", "K 2^G and A_kk (float32) for the solve",
     lambda: prepare_kk(k, k, g_kda, 1.0, Kg, Kw, decay, A_kk)),
    ("chunk_wy_gated", "the solve on A_kk, W and U", lambda: wy(Kg, v, beta32, A_kk, W, U)),
    ("gated_state_output_pass", "sequential: U - W S, the output, the gated state update",
     lambda: state_pass(Qw, Kw, W, U, A_qk, decay, h0, o, ht)),
]:
    stages.rows.append([name, what, median_ms(fn)])
print("\nEach KDA stage alone (same inputs):\n")
print(stages)
save_data({"rows": rows, "stages": [dict(stage=r[0], ms=r[2]) for r in stages.rows]})
