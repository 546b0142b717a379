# snippet: gpu
"""Level-5 latency on the H200, bf16, unit keys, b uniform in [0, 1], float32 gates logsigmoid(x):
KDA against fla's chunk_kda at three shapes, in one process on the same inputs; kda also without
the read-back of its value checks (check_values=False). Then each kda stage alone at the headline
shape. GDN has a record of its own (gdn_latency.py): with FlashQLA's compiles and fla's
autotuning both in one process, a cold machine did not finish it within a device call."""
import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.gated_delta import chunk_kda
from kda.kernels.build import compile_program
from kda.kernels.chunk_intra import chunk_intra
from kda.kernels.gated_state_pass import gated_state_output_pass
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.kda import chunk_kda as fla_kda

SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]   # (B, T, H, D), the first is the headline
C = 64


def inputs(B, T, H, D):
    q, k, v = random_qkv(B, T, H, D, D, seed=7)
    k = ref.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(8)
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
    return q, k, v, beta, g


table = Table([text(zh="算子", en="op"), "B, T, H, D", text(zh="实现", en="implementation"), "ms",
               text(zh="kda 快的倍数", en="kda faster by"), text(zh="达到下限的比例", en="at % of floor"),
               text(zh="rel L2 对比 kda", en="rel L2 vs kda")],
              formats=[None, None, None, "{:.3f}", "{:.2f}x", "{:.0%}", sci])
rows = []
for B, T, H, D in SHAPES:
    q, k, v, beta, g = inputs(B, T, H, D)
    scale = D ** -0.5
    fns = {"kda": lambda: chunk_kda(q, k, v, g, beta)[0],
           "kda, check_values=False": lambda: chunk_kda(q, k, v, g, beta, check_values=False)[0],
           "fla chunk_kda": lambda: fla_kda(q, k, v, g, beta, scale=scale)[0]}
    nbytes = (ledger.forward_min_bytes(B, T, H, D, D) + g.numel() * g.element_size()
              + beta.numel() * beta.element_size())
    floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C, delta=True), nbytes) * 1e3
    ours = fns["kda"]().double()
    ms = {name: median_ms(fn) for name, fn in fns.items()}
    for name, fn in fns.items():
        table.rows.append(["KDA", f"{B}, {T}, {H}, {D}", name, ms[name], ms[name] / ms["kda"], floor / ms[name],
                           0.0 if name == "kda" else rel_l2(fn(), ours)])
    rows.append({"op": "KDA", "B": B, "T": T, "H": H, "DK": D, "DV": D, "ms": ms, "floor": floor})
print(table)
print(text(zh="\n「kda 快的倍数」= 该实现的时间除以 kda 的时间；下限计入 q、k、v、o、g 与 beta 各一次，"
              "以及 delta 规则的 FLOPs（kda.ledger.forward_flops，delta=True）。",
           en="\n`kda faster by` = that implementation's time over kda's; the floor counts q, k, v, o, g and beta "
           "once, and the delta rule's FLOPs (kda.ledger.forward_flops with delta=True)."))

# each stage alone (KDA, the headline shape, the same inputs)
B, T, H, D = SHAPES[0]
q, k, v, beta, g = inputs(B, T, H, D)
NC = T // C
intra = compile_program(chunk_intra, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16")
state_pass = compile_program(gated_state_output_pass, (), DK=D, DV=D, chunk_size=C, dtype="bfloat16",
                             initial_state=True, final_state=True)
Qw, Kw, W, U, o = (torch.empty_like(q) for _ in range(5))
decay, A_qk = torch.empty(B, H, NC, D, device="cuda"), torch.empty(B, T, H, C, dtype=q.dtype, device="cuda")
h0, ht = torch.zeros(B, H, D, D, device="cuda"), torch.empty(B, H, D, D, device="cuda")
beta32 = beta.float()
flags = torch.zeros(2, dtype=torch.int32, device="cuda")
no_chunks = torch.empty(1, 1, dtype=torch.int32, device="cuda")   # dense: the chunk tables are stand-ins
no_kept = torch.empty(1, 1, 1, 1, device="cuda")   # chunk_intra's parked gates: a stand-in (keep_loaded off)
no_table = torch.empty(1, dtype=torch.int32, device="cuda")
total = rows[0]["ms"]["kda"]                        # chunk_kda at the headline shape, timed above
stages = Table([text(zh="阶段", en="stage"), text(zh="做什么", en="what it does"), "ms",
                text(zh="占 chunk_kda 的比例", en="share of chunk_kda")], formats=[None, None, "{:.3f}", "{:.0%}"])
for name, what, fn in [
    ("chunk_intra", text(zh="前缀和、因子表、由同一组 GEMM 算出的 Qw、Kw、decay、A_qk 与 A_kk、求解、W 与 U、"
                         "g 与 beta 的检查",
                         en="cumsum, factor tables, Qw, Kw, decay, A_qk and A_kk from one set of GEMMs, the solve, "
                         "W and U, checks of g and beta"),
     lambda: intra(q, k, v, g, beta32, D ** -0.5, Qw, Kw, decay, A_qk, W, U, flags, no_chunks, no_kept)),
    ("gated_state_output_pass", text(zh="顺序：U - W S、输出、带门控的状态更新",
                                     en="sequential: U - W S, the output, the gated state update"),
     lambda: state_pass(Qw, Kw, W, U, A_qk, decay, h0, o, ht, no_table, no_table, no_table)),
]:
    t = median_ms(fn)
    stages.rows.append([name, what, t, t / total])
rest = total - sum(r[2] for r in stages.rows)
stages.rows.append(["the rest", text(zh="读回标志、beta 转成 float32、内存分配",
                                    en="the flags read back, beta to float32, allocations"), rest, rest / total])
print(text(zh=f"\nKDA 各阶段单独计时，B, T, H, D = {B}, {T}, {H}, {D}（chunk_kda：{total:.3f} ms）：\n",
           en=f"\nEach KDA stage alone at B, T, H, D = {B}, {T}, {H}, {D} (chunk_kda: {total:.3f} ms):\n"))
print(stages)
save_data({"rows": rows, "total_ms": total, "stages": [dict(stage=r[0], ms=r[2]) for r in stages.rows]})
