# snippet: gpu
"""Level-2 latency on the H200, bf16, B = 1, H = 32, D = 128, RetNet's per-head decays
a_h = 1 - 2^-(5+h): kda.decay_attention (level 3's warp-specialised pass, the decay constant),
this chapter's pipelined kernel, the same kernel in the article's GEMM order and with every
weight tabulated, and fla's chunk_simple_gla with g_gamma = log(a), on the same inputs in one
process."""
import torch

from kda.ops import decay_attention
from kda import ledger
from kda.bench import fla_decay_attention, median_ms, random_qkv
from kda.kernels.chapters import constant_decay as kernels
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level2 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci

B, H, D, C = 1, 32, 128, 64
SCALE = D ** -0.5
alpha = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
log2_alpha = torch.log2(alpha).float().cuda()
g_gamma = torch.log(alpha).float().cuda()          # fla's form of the same decays
pipelined = compile_program(kernels.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16")
article_order = compile_program(kernels.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", overlap_gemms=False)
tables = compile_program(kernels.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", weight_tables=True)
no_state = torch.empty(1, 1, 1, 1, device="cuda")   # h0 and ht of a kernel compiled without states

q, k, v = random_qkv(B, 32768, H, D, D, seed=1)
expected = ref.chunked(q.double() * SCALE, k, v, alpha)[0]
o_pipelined, o_article, o_tables = torch.empty_like(v), torch.empty_like(v), torch.empty_like(v)
pipelined(q, k, v, log2_alpha, SCALE, no_state, o_pipelined, no_state)
article_order(q, k, v, log2_alpha, SCALE, no_state, o_article, no_state)
tables(q, k, v, log2_alpha, SCALE, no_state, o_tables, no_state)
errors = {"kda decay_attention": rel_l2(decay_attention(q, k, v, alpha), expected),
          text(zh="流水线 kernel", en="pipelined kernel"): rel_l2(o_pipelined, expected),
          text(zh="原文顺序", en="article order"): rel_l2(o_article, expected),
          text(zh="权重表", en="weight tables"): rel_l2(o_tables, expected),
          "fla chunk_simple_gla": rel_l2(fla_decay_attention(q, k, v, g_gamma, SCALE), expected)}
print(text(zh="与 float64 的误差，T = 32768（同一批输入）：",
           en="Error against float64 at T = 32768 (same inputs): ") +
      text(zh="；", en=", ").join(f"{name} {sci(e)}" for name, e in errors.items()) + "\n")
del expected

rows, data = [], []
for T in (2048, 8192, 32768, 65536):
    q, k, v = random_qkv(B, T, H, D, D, seed=T)
    o = torch.empty_like(v)
    t_kda = median_ms(lambda: decay_attention(q, k, v, alpha))
    t_pipelined = median_ms(lambda: pipelined(q, k, v, log2_alpha, SCALE, no_state, o, no_state))
    t_article = median_ms(lambda: article_order(q, k, v, log2_alpha, SCALE, no_state, o, no_state))
    t_tables = median_ms(lambda: tables(q, k, v, log2_alpha, SCALE, no_state, o, no_state))
    t_fla = median_ms(lambda: fla_decay_attention(q, k, v, g_gamma, SCALE))
    floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C),
                                 ledger.forward_min_bytes(B, T, H, D, D)) * 1e3
    rows.append([T, t_kda, t_pipelined, t_article, t_tables, t_fla, t_fla / t_kda, floor, floor / t_kda])
    data.append(dict(T=T, kda=t_kda, kda_pipelined=t_pipelined, kda_article_order=t_article,
                     kda_weight_tables=t_tables, fla=t_fla, floor=floor))
save_data({"B": B, "H": H, "D": D, "rows": data})
print(Table(["T", "kda (ms)", text(zh="流水线 kernel（ms）", en="pipelined kernel (ms)"),
             text(zh="原文顺序（ms）", en="article order (ms)"), text(zh="权重表（ms）", en="weight tables (ms)"),
             "fla (ms)", "fla / kda", text(zh="下限（ms）", en="floor (ms)"),
             text(zh="kda 达到下限的比例", en="kda at % of floor")], rows,
            [None, "{:.3f}", "{:.3f}", "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x", "{:.3f}", "{:.0%}"]))
