# snippet: gpu
"""The intra-card split on the H200 against the float64 token recurrence and against the unsplit
kernels, at B = 1, T = 8192, H = 2, D = 128, bf16, with an initial state. Two gate regimes: the
logsigmoid gates of the latency tables, under which the state forgets within a few hundred tokens,
and mild gates (log gate uniform in [-0.005, 0]), under which the state entering a run still
carries most of what came before, so a wrong map or fold would show."""
import torch

from kda.distributed import split_forward
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.reference import level4 as ref
from kda.reference.level3 import per_channel
from kda.site.runtime import text
from kda.tables import Table, sci

B, T, H, D = 1, 8192, 2, 128
gen = torch.Generator(device="cuda").manual_seed(3)
q = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
k = ref.l2_normalize(torch.randn(B, T, H, D, generator=gen, device="cuda")).bfloat16()
v = torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16()
beta = torch.rand(B, T, H, generator=gen, device="cuda")
h0 = torch.randn(B, H, D, D, generator=gen, device="cuda")
x = torch.randn(B, T, H, D, generator=gen, device="cuda")
GATES = {"logsigmoid": torch.nn.functional.logsigmoid(x),
         text(zh="温和", en="mild"): -0.005 * torch.rand(B, T, H, D, generator=gen, device="cuda")}

table = Table([text(zh="算子", en="op"), text(zh="门控", en="gates"), text(zh="段数 P", en="runs P"),
               text(zh="每段 token 数", en="tokens per run"), text(zh="一段的记忆", en="memory over a run"),
               "rel L2 o", text(zh="rel L2 最终状态", en="rel L2 final state"),
               text(zh="rel L2 o 对比不切分", en="rel L2 o vs unsplit")],
              formats=[None, None, None, None, sci, sci, sci, sci])
for op, forward in [("KDA", chunk_kda), ("GDN", chunk_gated_delta_rule)]:
    for name, g in GATES.items():
        g = g if op == "KDA" else g[..., 0].contiguous()
        ref_o, ref_s = ref0.recurrent(q.double() * D ** -0.5, k, v, g, beta, h0, True)
        plain, _ = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        for P in (1, 2, 8, 32):
            o, s = split_forward(q, k, v, g, beta, P, initial_state=h0, output_final_state=True)
            run = T // P
            # mean over channels and runs of exp(sum of the log gates over a run): the share of
            # the state that survives one run (1 = the whole sequence for P = 1)
            memory = per_channel(g.double(), D).reshape(B, P, run, H, D).sum(2).exp().mean().item()
            table.rows.append([op, name, P, run, memory, rel_l2(o, ref_o), rel_l2(s, ref_s), rel_l2(o, plain)])
print(text(zh=f"B, T, H, D = {B}, {T}, {H}, {D}，bf16，带初始状态；参照：float64 的逐 token 递推"
             "（rel L2 o、最终状态）"
             "与不切分的 kernel（P = 1）\n",
           en=f"B, T, H, D = {B}, {T}, {H}, {D}, bf16, initial state; references: the float64 token recurrence "
           "(rel L2 o, final state) and the unsplit kernel (P = 1)\n"))
print(table)
