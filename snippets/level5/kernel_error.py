# snippet: gpu
"""chunk_kda and chunk_gated_delta_rule on the H200 against the float64 token recurrence (fla's
measure: RMS of the difference over RMS of the reference), both dtypes, gates from mild to
extreme, b uniform in [0, 1], an initial state, a tail chunk, outputs poisoned with NaN; then the
same inputs through fla's chunk_kda."""
import torch

from kda import launch
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.reference import level4 as ref4
from kda.site.runtime import text
from kda.tables import Table, sci
from fla.ops.kda import chunk_kda as fla_chunk_kda

launch.poison_outputs = True
torch.manual_seed(0)
B, T, H, DK, DV = 2, 1000, 4, 128, 64
GATES = {
    "logsigmoid(x)": lambda shape: torch.nn.functional.logsigmoid(torch.randn(shape, device="cuda")),
    # KDA-style: most chunks too steep for the 32-row sub-chunks, so they take the 16-row ones
    "-2 softplus(x)": lambda shape: -2 * torch.nn.functional.softplus(torch.randn(shape, device="cuda")),
    text(zh="[-20, 0] 上均匀分布", en="uniform in [-20, 0]"): lambda shape: -20 * torch.rand(shape, device="cuda"),
    text(zh="logsigmoid，token 40-109 取 -20", en="logsigmoid, tokens 40-109 at -20"):
        lambda shape: torch.nn.functional.logsigmoid(torch.randn(shape, device="cuda")).index_fill_(
            1, torch.arange(40, 110, device="cuda"), -20.0),
}
not_run = "—"                     # fla's GDN is not compared here
sci_or_text = lambda x: x if isinstance(x, str) else sci(x)
table = Table([text(zh="算子", en="op"), text(zh="门控", en="gate"), "dtype", text(zh="误差 o", en="error o"),
               text(zh="最终状态误差", en="error final state"), text(zh="出现 NaN 或 inf", en="NaN or inf"),
               text(zh="fla chunk_kda 的误差", en="error of fla chunk_kda"),
               text(zh="kda 对比 fla", en="kda vs fla")],
              formats=[None, None, None, sci, sci, None, sci_or_text, sci_or_text])
for op, per_channel in [("chunk_kda", True), ("chunk_gated_delta_rule", False)]:
    for gate, make in GATES.items():
        for dtype in (torch.float16, torch.bfloat16):
            q = torch.randn(B, T, H, DK, device="cuda").to(dtype)
            k = ref4.l2_normalize(torch.randn(B, T, H, DK, device="cuda")).to(dtype)
            v = torch.randn(B, T, H, DV, device="cuda").to(dtype)
            g = make((B, T, H, DK) if per_channel else (B, T, H))
            beta = torch.rand(B, T, H, device="cuda")
            h0 = torch.randn(B, H, DK, DV, device="cuda")
            fn = chunk_kda if per_channel else chunk_gated_delta_rule
            o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True)
            ref_o, ref_ht = ref0.recurrent(q.double() * DK ** -0.5, k, v, g, beta, h0, True)
            finite = bool(torch.isfinite(o).all() and torch.isfinite(ht).all())
            fla_err = agree = not_run
            if per_channel:
                o_fla, _ = fla_chunk_kda(q, k, v, g, beta.to(dtype), initial_state=h0, output_final_state=True)
                fla_err, agree = rel_l2(o_fla, ref_o), rel_l2(o, o_fla.double())
            table.rows.append([op, gate, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], rel_l2(o, ref_o),
                               rel_l2(ht, ref_ht), text(zh="否", en="no") if finite else text(zh="是", en="yes"),
                               fla_err, agree])
print(text(zh=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}；单位键；scale = DK^-0.5；fla 的两列只针对 KDA"
              f"（它的 GDN 走 FlashQLA 或 Triton，延迟一节比较了它们；GDN 各行记为 {not_run}）\n",
           en=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}; unit keys; scale = DK^-0.5; fla's columns for KDA only "
           f"(its GDN runs through FlashQLA or Triton: the latency section compares them; {not_run} in the GDN "
           "rows)\n"))
print(table)
