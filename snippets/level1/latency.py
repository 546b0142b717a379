# snippet: gpu
"""Level-1 latency on the H200, bf16, B = 1, H = 32, D = 128: kda.linear_attention (level 3's
warp-specialised pass without a gate), this chapter's fused kernel, the same kernel in the
article's GEMM order, fla's chunk_linear_attn (normalize=False) and the sequence-in-grid kernel,
on the same inputs in one process. Median of many runs (triton do_bench, L2 flushed)."""
import torch

from kda.ops import linear_attention
from kda import ledger
from kda.bench import fla_linear_attention, median_ms, random_qkv
from kda.kernels.chapters import linear_attention as kernels
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level1 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci

B, H, D, C = 1, 32, 128, 64
SCALE = D ** -0.5
grid = compile_program(kernels.seq_in_grid, (), DK=D, DV=D, dtype="bfloat16")
fused = compile_program(kernels.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16")
article_order = compile_program(kernels.seq_in_loop, (), DK=D, DV=D, dtype="bfloat16", overlap_gemms=False)
no_state = torch.empty(1, 1, 1, 1, device="cuda")   # h0 and ht of a kernel compiled without states

# correctness of everything timed, at the headline shape, against float64
q, k, v = random_qkv(B, 32768, H, D, D, seed=1)
expected = ref.chunked(q.double() * SCALE, k, v)[0]
o_grid = torch.empty_like(v)
grid(q * SCALE, k, v, o_grid)     # the teaching kernel has no scale argument
o_fused, o_article = torch.empty_like(v), torch.empty_like(v)
fused(q, k, v, SCALE, no_state, o_fused, no_state)
article_order(q, k, v, SCALE, no_state, o_article, no_state)
errors = {"kda linear_attention": rel_l2(linear_attention(q, k, v), expected),
          text(zh="kda 融合 kernel", en="kda fused"): rel_l2(o_fused, expected),
          text(zh="kda 融合 kernel，原文顺序", en="kda fused, article order"): rel_l2(o_article, expected),
          "fla chunk_linear_attn": rel_l2(fla_linear_attention(q, k, v, SCALE), expected),
          "kda seq_in_grid": rel_l2(o_grid, expected)}
print(text(zh="与 float64 的误差，T = 32768（同一批输入）：",
           en="Error against float64 at T = 32768 (same inputs): ") +
      text(zh="；", en=", ").join(f"{name} {sci(e)}" for name, e in errors.items()) + "\n")
del expected

rows, data = [], []
for T in (2048, 8192, 32768, 65536):
    q, k, v = random_qkv(B, T, H, D, D, seed=T)
    o = torch.empty_like(v)
    qs = q * SCALE
    t_kda = median_ms(lambda: linear_attention(q, k, v))
    t_fused = median_ms(lambda: fused(q, k, v, SCALE, no_state, o, no_state))
    t_article = median_ms(lambda: article_order(q, k, v, SCALE, no_state, o, no_state))
    t_fla = median_ms(lambda: fla_linear_attention(q, k, v, SCALE))
    t_grid = median_ms(lambda: grid(qs, k, v, o), warmup_ms=50, rep_ms=300)
    floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C),
                                 ledger.forward_min_bytes(B, T, H, D, D)) * 1e3
    rows.append([T, t_kda, t_fused, t_article, t_fla, t_fla / t_kda, floor, floor / t_kda, t_grid, t_grid / t_fused,
                 ledger.redundancy(T, C)])
    data.append(dict(T=T, kda=t_kda, kda_fused=t_fused, kda_article_order=t_article, fla=t_fla, seq_in_grid=t_grid,
                     floor=floor))
save_data({"B": B, "H": H, "D": D, "rows": data})
print(Table(["T", "kda (ms)", text(zh="融合 kernel（ms）", en="fused kernel (ms)"),
             text(zh="原文顺序（ms）", en="article order (ms)"), "fla (ms)", "fla / kda",
             text(zh="下限（ms）", en="floor (ms)"), text(zh="kda 达到下限的比例", en="kda at % of floor"),
             "seq_in_grid (ms)", text(zh="seq_in_grid / 融合", en="seq_in_grid / fused"), "(NC-1)/2"], rows,
            [None, "{:.3f}", "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x", "{:.3f}", "{:.0%}", "{:.2f}", "{:.1f}x",
             "{:.1f}"]))
