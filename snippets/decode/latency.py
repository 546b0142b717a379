# snippet: gpu
"""Decode on the H200: one token per sequence (T = 1), H = 32 heads of 128, bf16, unit keys, b
uniform in [0, 1], float32 gates logsigmoid(x), a float32 state per sequence read and written
back; batch 1, 64 and 512. kda (checked and unchecked) against fla's fused_recurrent_kda and
fused_recurrent_gated_delta_rule on the same inputs in one process, and the floor: the states
read and written once plus q, k, v, g, beta and o. Then both captured in CUDA graphs and replayed,
as a server runs a decode step: the GPU's time alone, without the host's launch path."""
import torch

from kda import fused_recurrent_gated_delta_rule, fused_recurrent_kda, ledger
from kda.bench import captured, median_ms, random_qkv
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_gdn
from fla.ops.kda import fused_recurrent_kda as fla_kda

H, D = 32, 128
SCALE = D ** -0.5
table = Table([text(zh="算子", en="op"), "batch", "kda (ms)", "kda, check_values=False (ms)", "fla (ms)",
               text(zh="fla / 不检查的 kda", en="fla / kda unchecked"), text(zh="下限（ms）", en="floor (ms)"),
               text(zh="kda 不检查时达到下限的比例", en="kda unchecked at % of floor"),
               text(zh="rel L2 kda 对比 fla", en="rel L2 kda vs fla")],
              formats=[None, None, "{:.4f}", "{:.4f}", "{:.4f}", "{:.2f}x", "{:.4f}", "{:.0%}", sci])
graphs = Table([text(zh="算子", en="op"), "batch", text(zh="kda 在图中（ms）", en="kda in a graph (ms)"),
                text(zh="fla 在图中（ms）", en="fla in a graph (ms)"), "fla / kda",
                text(zh="下限（ms）", en="floor (ms)"),
                text(zh="kda 达到下限的比例", en="kda at % of floor")],
               formats=[None, None, "{:.4f}", "{:.4f}", "{:.2f}x", "{:.4f}", "{:.0%}"])
failed = []


def graph_ms(fn):
    """``fn`` captured in a CUDA graph (kda.bench.captured: after a warm-up on a side stream, as torch asks), then
    the median time of a replay."""
    return median_ms(captured(fn)[0].replay)


rows = []
for op in ("KDA", "GDN"):
    for B in (1, 64, 512):
        q, k, v = random_qkv(B, 1, H, D, D, seed=B)
        k = ref.l2_normalize(k.float()).bfloat16()
        gen = torch.Generator(device="cuda").manual_seed(B + 1)
        g = torch.nn.functional.logsigmoid(torch.randn(B, 1, H, *([D] if op == "KDA" else []), generator=gen,
                                                       device="cuda"))
        beta = torch.rand(B, 1, H, generator=gen, device="cuda")
        h0 = torch.randn(B, H, D, D, generator=gen, device="cuda")
        if op == "KDA":
            ours = lambda check: fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                     check_values=check)
            peer = lambda: fla_kda(q, k, v, g, beta, scale=SCALE, initial_state=h0, output_final_state=True)
        else:
            ours = lambda check: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                                  output_final_state=True, check_values=check)
            peer = lambda: fla_gdn(q, k, v, g=g, beta=beta, scale=SCALE, initial_state=h0, output_final_state=True)
        ms = {"kda": median_ms(lambda: ours(True)), "kda, check_values=False": median_ms(lambda: ours(False)),
              "fla": median_ms(peer)}
        nbytes = 2 * h0.numel() * 4 + 4 * B * H * D * 2 + g.numel() * 4 + beta.numel() * 4
        floor = ledger.floor_seconds(6 * B * H * D * D, nbytes) * 1e3
        agreement = rel_l2(ours(False)[0], peer()[0].double())
        table.rows.append([op, B, ms["kda"], ms["kda, check_values=False"], ms["fla"],
                           ms["fla"] / ms["kda, check_values=False"], floor, floor / ms["kda, check_values=False"],
                           agreement])
        replayed = {}
        for name, fn in (("kda", lambda: ours(False)), ("fla", peer)):
            try:
                replayed[name] = graph_ms(fn)
            except Exception as e:  # noqa: BLE001  (a peer that cannot be captured is reported, not hidden)
                replayed[name] = float("nan")
                failed.append(f"{op}, batch {B}, {name}: {str(e).splitlines()[0][:160]}")
        graphs.rows.append([op, B, replayed["kda"], replayed["fla"], replayed["fla"] / replayed["kda"], floor,
                            floor / replayed["kda"]])
        rows.append({"op": op, "B": B, "T": 1, "H": H, "DK": D, "DV": D, "ms": ms, "floor": floor,
                     "graph_ms": replayed})
print(table)
print(text(zh="\n下限计入 float32 状态的一次读取和一次写回（2 B H K V 4 字节）、"
              "bf16 的 q、k、v、o 与 float32 的 g、beta，"
              "按 4.3 TB/s 计。",
           en="\nThe floor counts the float32 states read and written once (2 B H K V 4 bytes), q, k, v, o in "
           "bf16 and g, beta in float32, at 4.3 TB/s."))
print(text(zh="\n同样的步骤捕获进 CUDA graph 后重放（kda 不检查：graph 里不能把值读回）：\n",
           en="\nThe same steps captured in CUDA graphs and replayed (kda unchecked: a graph cannot read values "
           "back):\n"))
print(graphs)
for line in failed:
    print(text(zh=f"\n捕获失败：{line}", en=f"\nCapture failed: {line}"))
save_data({"rows": rows})
