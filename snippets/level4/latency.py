# snippet: gpu
"""Level-4 latency on the H200 at B = 1, T = 32768, H = 32, D = 128, bf16, unit keys, b uniform in
[0, 1]: kda.delta_rule against fla's chunk_delta_rule on the same inputs in one process, then each
kda stage alone."""
import tilelang
import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.delta import delta_rule
from kda.kernels import level4 as kernels
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data
from kda.tables import Table, sci
from fla.ops.delta_rule import chunk_delta_rule

tilelang.set_log_level("ERROR")
B, T, H, D, C = 1, 32768, 32, 128, 64
SCALE = D ** -0.5
q, k, v = random_qkv(B, T, H, D, D, seed=5)
k = ref.l2_normalize(k.float()).bfloat16()
beta = torch.rand(B, T, H, device="cuda")
beta_bf16 = beta.bfloat16()                       # fla takes beta in the dtype of q

t_kda = median_ms(lambda: delta_rule(q, k, v, beta))
t_unchecked = median_ms(lambda: delta_rule(q, k, v, beta, check_beta=False))
t_fla = median_ms(lambda: chunk_delta_rule(q, k, v, beta_bf16, scale=SCALE)[0])
agreement = rel_l2(delta_rule(q, k, v, beta_bf16.float()), chunk_delta_rule(q, k, v, beta_bf16, scale=SCALE)[0].double())
NC = T // C
nbytes = ledger.forward_min_bytes(B, T, H, D, D) + beta.numel() * beta.element_size()
floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C), nbytes) * 1e3
table = Table(["kda (ms)", "kda, check_beta=False (ms)", "fla chunk_delta_rule (ms)", "fla / kda", "floor (ms)",
               "kda at % of floor", "rel L2 kda vs fla"],
              formats=["{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x", "{:.3f}", "{:.0%}", sci])
table.rows.append([t_kda, t_unchecked, t_fla, t_fla / t_kda, floor, floor / t_kda, agreement])
print(table)

wy = compile_program(kernels.chunk_wy, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16")
state = compile_program(kernels.state_pass, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16")
output = compile_program(kernels.chunk_output, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16")
W, U = torch.empty_like(k), torch.empty_like(v)
Ainv = torch.empty(B, T, H, C, device="cuda")
h = torch.empty(B, NC, H, D, D, dtype=q.dtype, device="cuda")
v_new, o = torch.empty_like(v), torch.empty_like(v)
h0, ht = torch.zeros(B, H, D, D, device="cuda"), torch.empty(B, H, D, D, device="cuda")
stages = Table(["stage", "what it does", "ms"], formats=[None, None, "{:.3f}"])
for name, what, fn in [
    ("chunk_wy", "K K^T, the blocked solve, W and U (all chunks at once)", lambda: wy(k, v, beta, W, U, Ainv)),
    ("state_pass", "sequential: snapshots, U - W S, S += K^T (U - W S)", lambda: state(k, W, U, h0, h, v_new, ht)),
    ("chunk_output", "Q S + tril(Q K^T) (U - W S) (all chunks at once)", lambda: output(q, k, h, v_new, SCALE, o)),
]:
    stages.rows.append([name, what, median_ms(fn)])
print("\nEach stage alone (same inputs):\n")
print(stages)
save_data({"rows": [dict(T=T, kda=t_kda, kda_unchecked=t_unchecked, fla=t_fla, floor=floor)],
           "stages": [dict(stage=r[0], ms=r[2]) for r in stages.rows]})
