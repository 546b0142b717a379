# snippet: gpu
"""Level-3 latency on the H200 at B = 1, T = 32768, H = 32, D = 128, bf16, float32 gates drawn
as logsigmoid of a normal (GLA's gate): kda.gated_attention against fla's chunk_simple_gla (scalar
g) and chunk_gla (per-channel g) on the same inputs in one process, then each kda stage alone. Both
forms check g inside their first kernel (the cumsum for a scalar gate, chunk_intra for a per-channel
one) and read one flag back once the second kernel is queued."""
import tilelang
import torch

from kda.gated import gated_attention
from kda.launch import SCALAR_PASS_CONFIG
from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.kernels.chunk_intra import chunk_intra
from kda.kernels.linear_pass import chunk_cumsum, seq_in_loop_scalar
from kda.kernels.per_channel_pass import seq_in_loop_per_channel
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gla import chunk_gla
from fla.ops.simple_gla import chunk_simple_gla

tilelang.set_log_level("ERROR")   # its cache notices go to stdout, which is this page's output
B, T, H, D, C = 1, 32768, 32, 128, 64
SCALE = D ** -0.5
q, k, v = random_qkv(B, T, H, D, D, seed=3)
gen = torch.Generator(device="cuda").manual_seed(4)
g_scalar = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
g_channel = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))

OPS = {"scalar": ("gated, scalar g", "fla chunk_simple_gla(g)"),
       "per channel": ("gated, per-channel g", "fla chunk_gla")}
runs = {
    "scalar": {
        "kda": lambda: gated_attention(q, k, v, g_scalar),
        "kda, check_values=False": lambda: gated_attention(q, k, v, g_scalar, check_values=False),
        "fla chunk_simple_gla(g)": lambda: chunk_simple_gla(q, k, v, g=g_scalar, scale=SCALE)[0],
    },
    "per channel": {
        "kda": lambda: gated_attention(q, k, v, g_channel),
        "kda, check_values=False": lambda: gated_attention(q, k, v, g_channel, check_values=False),
        "fla chunk_gla": lambda: chunk_gla(q, k, v, g=g_channel, scale=SCALE)[0],
    },
}
table = Table([text(zh="门控", en="gate"), text(zh="fla 对应算子", en="fla peer"), "kda (ms)",
               "kda, check_values=False (ms)", "fla (ms)", "fla / kda", text(zh="下限（ms）", en="floor (ms)"),
               text(zh="kda 达到下限的比例", en="kda at % of floor"),
               text(zh="rel L2 kda 对比 fla", en="rel L2 kda vs fla")],
              formats=[None, None, "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x", "{:.3f}", "{:.0%}", sci])
rows = []
for form, fns in runs.items():
    op, peer = OPS[form]
    g = g_scalar if form == "scalar" else g_channel
    agreement = rel_l2(fns["kda"](), fns[peer]().double())
    ms = {name: median_ms(fn) for name, fn in fns.items()}
    nbytes = ledger.forward_min_bytes(B, T, H, D, D) + g.numel() * g.element_size()   # + the gates, read once
    floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C), nbytes) * 1e3
    table.rows.append([text(zh={"scalar": "标量", "per channel": "逐通道"}.get(form, form), en=form),
                       peer.removeprefix("fla "), ms["kda"], ms["kda, check_values=False"], ms[peer],
                       ms[peer] / ms["kda"], floor, floor / ms["kda"], agreement])
    rows.append({"op": op, "B": B, "T": T, "H": H, "DK": D, "DV": D, "ms": ms, "floor": floor})
print(table)

# each stage alone, on the same inputs
NC = T // C
cumsum = compile_program(chunk_cumsum, (), D=1, chunk_size=C, gate_dtype="float32")
scalar_pass = compile_program(seq_in_loop_scalar, (), DK=D, DV=D, dtype="bfloat16", **SCALAR_PASS_CONFIG)
intra = compile_program(chunk_intra, (), DK=D, chunk_size=C, dtype="bfloat16", gate_dtype="float32",
                        delta=False)
channel_pass = compile_program(seq_in_loop_per_channel, (), DK=D, DV=D, dtype="bfloat16")
G = torch.empty(B, H, T, device="cuda")
o = torch.empty_like(v)
Qw, Kw = torch.empty_like(q), torch.empty_like(k)
decay = torch.empty(B, H, NC, D, device="cuda")
A = torch.empty(B, T, H, C, dtype=q.dtype, device="cuda")
flags = torch.zeros(2, dtype=torch.int32, device="cuda")
v_rows, beta_rows = torch.empty(1, 1, 1, 1, dtype=q.dtype, device="cuda"), torch.empty(1, 1, 1, device="cuda")
no_chunks = torch.empty(1, 1, dtype=torch.int32, device="cuda")   # chunk_intra's stand-ins without the delta rule
no_kept = torch.empty(1, 1, 1, 1, device="cuda")   # and for its parked gates (keep_loaded off)
no_state = torch.empty(1, 1, 1, 1, device="cuda")   # the passes' h0 and ht, compiled without states
no_w = torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.bfloat16)   # the scalar pass's W: no delta rule
g_steep = g_channel * 30          # logsigmoid * 30: some sub-chunk of most chunks falls by > 96 (log2)
stages = Table([text(zh="门控", en="gate"), text(zh="阶段", en="stage"), text(zh="做什么", en="what it does"), "ms"],
               formats=[None, None, None, "{:.3f}"])
for form, name, what, fn in [
    ("scalar", "chunk_cumsum", text(zh="G = g / ln 2 的块内前缀和，以及 g 的取值范围检查",
                                    en="G = chunk-local cumsum of g / ln 2, and the range check of g"),
     lambda: cumsum(g_scalar.view(B, T, H, 1), G.view(B, H, T, 1), flags)),
    ("scalar", "seq_in_loop_scalar", text(zh="对各块的融合遍历", en="the fused pass over the chunks"),
     lambda: scalar_pass(q, k, v, no_w, G, SCALE, no_state, o, no_state)),
    ("per channel", "chunk_intra(delta=False)",
     text(zh="前缀和与取值范围检查，Qw、Kw、decay、A（bf16 对角块）",
          en="cumsum and range check, Qw, Kw, decay, A (bf16 diagonal blocks)"),
     lambda: intra(q, k, v_rows, g_channel, beta_rows, SCALE, Qw, Kw, decay, A, v_rows, v_rows, flags, no_chunks,
                   no_kept)),
    ("per channel", "chunk_intra(delta=False), steep gates",
     text(zh="同上，门控为 logsigmoid * 30（对角块走逐对路径）",
          en="the same with logsigmoid * 30 (pairwise diagonal)"),
     lambda: intra(q, k, v_rows, g_steep, beta_rows, SCALE, Qw, Kw, decay, A, v_rows, v_rows, flags, no_chunks,
                   no_kept)),
    ("per channel", "seq_in_loop_per_channel",
     text(zh="对各块的遍历：Qw S + A V，状态更新", en="the pass over the chunks: Qw S + A V, state update"),
     lambda: channel_pass(Qw, Kw, A, decay, v, no_state, o, no_state)),
]:
    stages.rows.append([form, name, what, median_ms(fn)])
print(text(zh="\n各阶段单独计时（同一批输入）：\n", en="\nEach stage alone (same inputs):\n"))
print(stages)
save_data({"B": B, "H": H, "D": D, "rows": rows,
           "stages": [dict(form=r[0], stage=r[1], ms=r[3]) for r in stages.rows]})
