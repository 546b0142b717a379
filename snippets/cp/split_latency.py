# snippet: gpu
"""The intra-card split on the H200 at B = 1, T = 131072, H = 4, D = 128, bf16, unit keys, b uniform
in [0, 1], float32 gates logsigmoid(x): kda with and without the split, against fla's chunk_kda
(KDA) and, for GDN, fla's Triton path (FLA_FLASH_QLA=0) and FlashQLA with and without its own
automatic split, and the ops as a model calls them (chunk_kda, chunk_gated_delta_rule: they take
the split themselves where op_split's rule splits, SPLIT_IN_OP); all in one process on the same
inputs. Then where the split pays (over T and B * H, KDA) and the split's stages."""
import os

import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.distributed import choose_pieces, chunk_maps, fold, runs_form, split_forward
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.kernels.chunk_intra import prepare_chunks
from kda.kernels.gated_state_pass import run_state_pass
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
from fla.ops.kda import chunk_kda as fla_kda
import flash_qla

assert os.environ.get("FLA_FLASH_QLA") == "0", "run with FLA_FLASH_QLA=0 so that fla's GDN is its own Triton path"
SMS = torch.cuda.get_device_properties(0).multi_processor_count
D, C = 128, 64
SCALE = D ** -0.5


def make_inputs(B, T, H, seed=7):
    q, k, v = random_qkv(B, T, H, D, D, seed=seed)
    k = ref.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    g_kda = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
    g_gdn = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
    return q, k, v, beta, g_kda, g_gdn


def floor_ms(B, T, H, g, beta):
    nbytes = (ledger.forward_min_bytes(B, T, H, D, D) + g.numel() * g.element_size()
              + beta.numel() * beta.element_size())
    return ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C, delta=True), nbytes) * 1e3


# 1. the anchor shape, all implementations
B, T, H = 1, 131072, 4
q, k, v, beta, g_kda, g_gdn = make_inputs(B, T, H)
auto = choose_pieces(B, H, D, T, SMS)
runs = {
    "KDA": {"kda, no split": lambda: split_forward(q, k, v, g_kda, beta, 1)[0],
            f"kda, split into {auto} (auto)": lambda: split_forward(q, k, v, g_kda, beta)[0],
            "kda chunk_kda (SPLIT_IN_OP)": lambda: chunk_kda(q, k, v, g_kda, beta)[0],
            "fla chunk_kda": lambda: fla_kda(q, k, v, g_kda, beta, scale=SCALE)[0]},
    "GDN": {"kda, no split": lambda: split_forward(q, k, v, g_gdn, beta, 1)[0],
            f"kda, split into {auto} (auto)": lambda: split_forward(q, k, v, g_gdn, beta)[0],
            "kda chunk_gated_delta_rule (SPLIT_IN_OP)": lambda: chunk_gated_delta_rule(q, k, v, g_gdn, beta)[0],
            "fla chunk_gated_delta_rule (Triton)": lambda: fla_gdn(q, k, v, g_gdn, beta, scale=SCALE)[0],
            "FlashQLA 0.1.3, auto_cp=True": lambda: flash_qla.chunk_gated_delta_rule(
                q, k, v, g_gdn, beta, scale=SCALE, auto_cp=True)[0],
            "FlashQLA 0.1.3, auto_cp=False": lambda: flash_qla.chunk_gated_delta_rule(
                q, k, v, g_gdn, beta, scale=SCALE, auto_cp=False)[0]},
}
table = Table([text(zh="算子", en="op"), text(zh="实现", en="implementation"), "ms",
               text(zh="时间 / kda 切分", en="time / kda split"), text(zh="达到下限的比例", en="at % of floor"),
               text(zh="rel L2 对比 kda 不切分", en="rel L2 vs kda no split")],
              formats=[None, None, "{:.3f}", "{:.2f}x", "{:.0%}", sci])
rows = []
for op, fns in runs.items():
    floor = floor_ms(B, T, H, g_kda if op == "KDA" else g_gdn, beta)
    plain = fns["kda, no split"]().double()
    t = {name: median_ms(fn) for name, fn in fns.items()}
    split_ms = t[f"kda, split into {auto} (auto)"]
    for name, fn in fns.items():
        table.rows.append([op, text(zh={"kda, no split": "kda，不切分",
                                        f"kda, split into {auto} (auto)": f"kda，切成 {auto} "
                                                                          "段（自动）",
                                        "kda chunk_kda (SPLIT_IN_OP)": "kda chunk_kda（算子自行切分）",
                                        "kda chunk_gated_delta_rule (SPLIT_IN_OP)":
                                            "kda chunk_gated_delta_rule（算子自行切分）"}.get(name, name),
                                    en=name),
                           t[name], t[name] / split_ms, floor / t[name],
                           0.0 if name == "kda, no split" else rel_l2(fn(), plain)])
    rows.append(dict(op=op, B=B, T=T, H=H, pieces=auto, floor=floor, **t))
print(text(zh=f"B, T, H, D = {B}, {T}, {H}, {D}；{SMS} 个 SM；choose_pieces -> {auto} 段\n",
           en=f"B, T, H, D = {B}, {T}, {H}, {D}; {SMS} SMs; choose_pieces -> {auto} runs\n"))
print(table)

# 2. where the split pays: kda KDA over T and B * H, runs P = 1 (no split) to 32
sweep = Table(["B", "H", "T", text(zh="不切分时的 block 数", en="blocks unsplit"), "P = 1", "P = 2", "P = 4", "P = 8",
               "P = 16", "P = 32", text(zh="自动选择的 P", en="auto P"), text(zh="自动 / P = 1", en="auto / P = 1")],
              formats=[None] * 4 + ["{:.3f}"] * 6 + [None, "{:.2f}x"])
sweep_rows = []
for Bs, Hs, Ts in [(1, 4, 131072), (1, 4, 32768), (1, 4, 8192), (1, 8, 131072), (1, 16, 65536), (4, 4, 32768),
                   (1, 32, 32768)]:
    del q, k, v, beta, g_kda, g_gdn
    q, k, v, beta, g_kda, g_gdn = make_inputs(Bs, Ts, Hs, seed=Ts + Hs)
    t = {P: median_ms(lambda: split_forward(q, k, v, g_kda, beta, P)[0]) for P in (1, 2, 4, 8, 16, 32)}
    P_auto = choose_pieces(Bs, Hs, D, Ts, SMS)
    sweep.rows.append([Bs, Hs, Ts, Bs * Hs * D // 32, *t.values(), P_auto, t[1] / t[P_auto]])
    sweep_rows.append(dict(B=Bs, H=Hs, T=Ts, auto=P_auto, **{f"P{P}": ms for P, ms in t.items()}))
print(text(zh="\nkda KDA，ms，序列切成 P 段（P = 1 即 chunk_kda）：\n",
           en="\nkda KDA, ms, with the sequence cut into P runs (P = 1 is chunk_kda):\n"))
print(sweep)

# 3. the split's stages at the anchor shape (KDA)
del q, k, v, beta, g_kda, g_gdn
q, k, v, beta, g_kda, g_gdn = make_inputs(B, T, H)
form = prepare_chunks(q, k, v, g_kda, beta, SCALE)
runs_ = runs_form(form, auto)
M, Bm = (x.reshape(B, auto, *x.shape[1:]) for x in chunk_maps(runs_))
S0 = torch.zeros_like(Bm[:, 0])
starts = torch.stack(fold(S0, [(M[:, p], Bm[:, p]) for p in range(auto - 1)]), dim=1).reshape(B * auto, H, D, D)
stages = Table([text(zh="阶段", en="stage"), text(zh="做什么", en="what it does"), "ms"],
               formats=[None, None, "{:.3f}"])
for name, what, fn in [
    ("prepare_chunks", text(zh="chunk_intra：分数、求解、W 与 U，所有块同时计算",
                            en="chunk_intra: scores, solve, W and U, every chunk at once"),
     lambda: prepare_chunks(q, k, v, g_kda, beta, SCALE)),
    ("run_state_pass, no split", text(zh=f"在 {T // C} 个块上的顺序一趟，{B * H * D // 32} 个 block",
                                      en=f"the sequential pass over {T // C} chunks, {B * H * D // 32} blocks"),
     lambda: run_state_pass(form, None)),
    ("runs_form", text(zh="把各段作为一个 batch（重排块衰减）", en="the runs as a batch (the chunk decay reordered)"),
     lambda: runs_form(form, auto)),
    ("chunk_maps", text(zh=f"{auto} 段的 B 与 M：两趟状态传递，各 {B * H * D // 32 * auto} 个 block",
                        en=f"B and M of {auto} runs: two state passes, {B * H * D // 32 * auto} blocks each"),
     lambda: chunk_maps(runs_)),
    ("fold", text(zh=f"{auto - 1} 步 S <- M S + B，作用在 [B, H, {D}, {D}] 上（torch matmul）",
                  en=f"{auto - 1} steps S <- M S + B on [B, H, {D}, {D}] (torch matmul)"),
     lambda: fold(S0, [(M[:, p], Bm[:, p]) for p in range(auto - 1)])),
    ("run_state_pass, runs", text(zh=f"{auto} 段从各自真实的状态出发重算",
                                  en=f"the recompute of {auto} runs from their true states"),
     lambda: run_state_pass(runs_, starts)),
]:
    stages.rows.append([name, what, median_ms(fn)])
print(text(zh=f"\n切分的各阶段，B, T, H = {B}, {T}, {H}，P = {auto}（KDA）：\n",
           en=f"\nThe split's stages at B, T, H = {B}, {T}, {H}, P = {auto} (KDA):\n"))
print(stages)
save_data({"rows": rows, "sweep": sweep_rows, "stages": [dict(stage=r[0], ms=r[2]) for r in stages.rows]})
