# snippet: gpu
"""Level-4 latency on the H200 at B = 1, T = 32768, H = 32, D = 128, bf16, unit keys, b uniform in
[0, 1]: kda.delta_rule against fla's chunk_delta_rule on the same inputs in one process, then each
kda stage alone, the fused sequential pass against the split one."""
import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.delta import delta_rule
from kda.kernels.chapters.delta_split import chunk_output, state_pass
from kda.kernels.linear_pass import state_output_pass
from kda.kernels.wy_solve import chunk_wy
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.delta_rule import chunk_delta_rule

B, T, H, D, C = 1, 32768, 32, 128, 64
SCALE = D ** -0.5
q, k, v = random_qkv(B, T, H, D, D, seed=5)
k = ref.l2_normalize(k.float()).bfloat16()
beta = torch.rand(B, T, H, device="cuda").bfloat16()   # fla takes beta in the dtype of q

t_kda = median_ms(lambda: delta_rule(q, k, v, beta))
t_unchecked = median_ms(lambda: delta_rule(q, k, v, beta, check_values=False))
t_fla = median_ms(lambda: chunk_delta_rule(q, k, v, beta, scale=SCALE)[0])
agreement = rel_l2(delta_rule(q, k, v, beta), chunk_delta_rule(q, k, v, beta, scale=SCALE)[0].double())
nbytes = ledger.forward_min_bytes(B, T, H, D, D) + beta.numel() * beta.element_size()
flops = ledger.forward_flops(B, T, H, D, D, C, delta=True)
floor = ledger.floor_seconds(flops, nbytes) * 1e3
table = Table(["kda (ms)", "kda, check_values=False (ms)", "fla chunk_delta_rule (ms)", "fla / kda",
               text(zh="下限（ms）", en="floor (ms)"), text(zh="kda 达到下限的比例", en="kda at % of floor"),
               text(zh="rel L2 kda 对比 fla", en="rel L2 kda vs fla")],
              formats=["{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x", "{:.3f}", "{:.0%}", sci])
table.rows.append([t_kda, t_unchecked, t_fla, t_fla / t_kda, floor, floor / t_kda, agreement])
print(table)
print(text(zh=f"\n下限：{flops / 1e9:.0f} GFLOP 按 686 TFLOP/s 计 = {flops / ledger.H200_BF16_FLOPS * 1e3:.3f} ms；"
              f"{nbytes / 1e9:.2f} GB（q、k、v、o、beta）按 4.3 TB/s 计 = "
              f"{nbytes / ledger.H200_HBM_BYTES_PER_S * 1e3:.3f} ms。",
           en=f"\nFloor: {flops / 1e9:.0f} GFLOP at 686 TFLOP/s = {flops / ledger.H200_BF16_FLOPS * 1e3:.3f} ms; "
           f"{nbytes / 1e9:.2f} GB (q, k, v, o, beta) at 4.3 TB/s = "
           f"{nbytes / ledger.H200_HBM_BYTES_PER_S * 1e3:.3f} ms."))

NC = T // C
build = lambda fn, **kw: compile_program(fn, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16", **kw)
wy, wy_products = build(chunk_wy), build(chunk_wy, merge="products")
no_inverse = torch.empty(1, 1, 1, 1, device="cuda")       # Ainv's stand-in: the inverse is not written
no_gate = torch.empty(1, device="cuda")                   # state_output_pass has no gate
flags = torch.zeros(2, dtype=torch.int32, device="cuda")  # chunk_wy's check of beta
fused = build(state_output_pass, initial_state=True, final_state=True)   # like state_pass: h0 in, ht out
state, output = build(state_pass), build(chunk_output)
beta32 = beta.float()
W, U = torch.empty_like(k), torch.empty_like(v)
h = torch.empty(B, NC, H, D, D, dtype=q.dtype, device="cuda")
v_new, o = torch.empty_like(v), torch.empty_like(v)
h0, ht = torch.zeros(B, H, D, D, device="cuda"), torch.empty(B, H, D, D, device="cuda")
stages = Table([text(zh="阶段", en="stage"), text(zh="做什么", en="what it does"),
                text(zh="kda.delta_rule 是否使用", en="in kda.delta_rule"), "ms"],
               formats=[None, None, None, "{:.3f}"])
for name, what, used, fn in [
    ("chunk_wy", text(zh="beta 的检查、K K^T、求解（CUDA core 合并）、W 与 U；所有块同时计算",
                      en="the check of beta, K K^T, the solve (CUDA-core merge), W and U; all chunks at once"),
     text(zh="是", en="yes"), lambda: wy(k, v, beta32, W, U, no_inverse, flags)),
    ("chunk_wy, merge='products'", text(zh="同上，对角线以下的块用 4 次 tf32 GEMM",
                                        en="the same, blocks below the diagonal by 4 tf32 GEMMs"),
     text(zh="否", en="no"), lambda: wy_products(k, v, beta32, W, U, no_inverse, flags)),
    ("state_output_pass", text(zh="顺序：U - W S、输出、S += K^T (U - W S)",
                               en="sequential: U - W S, the output, S += K^T (U - W S)"), text(zh="是", en="yes"),
     lambda: fused(q, k, U, W, no_gate, SCALE, h0, o, ht)),
    ("state_pass", text(zh="拆开，顺序：快照 h 与 U - W S 写入 HBM",
                        en="split, sequential: snapshots h and U - W S to HBM"), text(zh="否", en="no"),
     lambda: state(k, W, U, h0, h, v_new, ht)),
    ("chunk_output", text(zh="拆开，所有块同时计算：Q h + tril(Q K^T) (U - W S)",
                          en="split, all chunks at once: Q h + tril(Q K^T) (U - W S)"), text(zh="否", en="no"),
     lambda: output(q, k, h, v_new, SCALE, o)),
]:
    stages.rows.append([name, what, used, median_ms(fn)])
print(text(zh="\n各阶段单独计时（同一批输入）：\n", en="\nEach stage alone (same inputs):\n"))
print(stages)
ms = {r[0]: r[3] for r in stages.rows}
split_bytes = ledger.state_snapshot_bytes(B, T, H, D, D, C) * 2 + 2 * v.numel() * v.element_size()
print(text(zh=f"\n融合的顺序一趟 {ms['state_output_pass']:.3f} ms，拆开的是 "
              f"{ms['state_pass'] + ms['chunk_output']:.3f} ms（state_pass + chunk_output）；"
              "拆开的形式还多经过 HBM 搬运 "
              f"{split_bytes / 1e9:.2f} GB（快照 h 与 U - W S，写入后再读回）。",
           en=f"\nFused sequential pass {ms['state_output_pass']:.3f} ms against split "
           f"{ms['state_pass'] + ms['chunk_output']:.3f} ms (state_pass + chunk_output); the split form also moves "
           f"{split_bytes / 1e9:.2f} GB more through HBM (snapshots h and U - W S, written and read back)."))
save_data({"rows": [dict(T=T, kda=t_kda, kda_unchecked=t_unchecked, fla=t_fla, floor=floor)],
           "stages": [dict(stage=r[0], ms=r[3]) for r in stages.rows]})
