# snippet: gpu
"""Packed sequences and grouped value heads on the H200, bf16, unit keys, b uniform in [0, 1],
float32 gates logsigmoid(x), H = 32 heads of 128: (1) 96 sequences of random lengths, 32768
tokens; (2) 1024 sequences of 1 to 64 tokens. Each packed call (one launch per stage) is timed
beside kda on the same tokens as one sequence, and against fla (chunk_kda, and chunk_gated_delta_rule
on its own Triton path, FLA_FLASH_QLA=0) and FlashQLA 0.1.3 with the same cu_seqlens; kda also
with the host copy cu_seqlens_cpu. (3) Grouped value heads as in Qwen3-Next's GDN: 16 query and
key heads, 32 value heads, T = 32768."""
import os

import torch

from kda import ledger
from kda.bench import median_ms, random_qkv
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
from fla.ops.kda import chunk_kda as fla_kda
import flash_qla

assert os.environ.get("FLA_FLASH_QLA") == "0", "run with FLA_FLASH_QLA=0 so that fla's GDN is its own Triton path"
H, D, C = 32, 128, 64


def lengths(case):
    """Sequence lengths of a packed case, seeded."""
    gen = torch.Generator().manual_seed(96)
    if case == "96 random lengths":
        cuts = torch.randperm(32767, generator=gen)[:95].sort().values + 1
        return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([32768])])).tolist()
    return torch.randint(1, 65, (1024,), generator=gen).tolist()


def inputs(T, HQ, HV):
    q, k, v = random_qkv(1, T, HV, D, D, seed=7)
    q, k = q[:, :, :HQ].contiguous(), ref.l2_normalize(k[:, :, :HQ].float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(8)
    beta = torch.rand(1, T, HV, generator=gen, device="cuda").bfloat16()
    g_kda = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, D, generator=gen, device="cuda"))
    g_gdn = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, generator=gen, device="cuda"))
    return q, k, v, beta, g_kda, g_gdn


def floor_ms(T, HQ, HV, g, beta):
    nbytes = (2 * T * HQ * D * 2 + 2 * T * HV * D * 2 + g.numel() * g.element_size()
              + beta.numel() * beta.element_size())
    return ledger.floor_seconds(ledger.forward_flops(1, T, HV, D, D, C, delta=True), nbytes) * 1e3


table = Table([text(zh="情形", en="case"), text(zh="算子", en="op"), text(zh="实现", en="implementation"), "ms",
               text(zh="kda 快的倍数", en="kda faster by"), text(zh="达到下限的比例", en="at % of floor"),
               text(zh="rel L2 对比 kda", en="rel L2 vs kda")],
              formats=[None, None, None, "{:.3f}", "{:.2f}x", "{:.0%}",
                       lambda x: x if isinstance(x, str) else sci(x)])
rows = []
scale = D ** -0.5
for case in ["96 random lengths", "1024 sequences of 1 to 64 tokens", "grouped value heads, 16 / 32"]:
    packed = case != "grouped value heads, 16 / 32"
    lens = lengths(case) if packed else [32768]
    T = sum(lens)
    HQ = H if packed else 16
    q, k, v, beta, g_kda, g_gdn = inputs(T, HQ, H)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
    cu_cpu, cu_long = cu.cpu(), cu.long()
    runs = {}
    if packed:
        runs["KDA"] = {
            "kda": lambda: chunk_kda(q, k, v, g_kda, beta, cu_seqlens=cu)[0],
            "kda, cu_seqlens_cpu": lambda: chunk_kda(q, k, v, g_kda, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)[0],
            "kda, one sequence of the same tokens": lambda: chunk_kda(q, k, v, g_kda, beta)[0],
            "fla chunk_kda": lambda: fla_kda(q, k, v, g_kda, beta, scale=scale, cu_seqlens=cu_long)[0]}
    gdn = {"kda": lambda: chunk_gated_delta_rule(q, k, v, g_gdn, beta, cu_seqlens=cu if packed else None)[0]}
    if packed:
        gdn["kda, cu_seqlens_cpu"] = lambda: chunk_gated_delta_rule(q, k, v, g_gdn, beta, cu_seqlens=cu,
                                                                     cu_seqlens_cpu=cu_cpu)[0]
        gdn["kda, one sequence of the same tokens"] = lambda: chunk_gated_delta_rule(q, k, v, g_gdn, beta)[0]
    gdn["fla chunk_gated_delta_rule (Triton)"] = lambda: fla_gdn(q, k, v, g_gdn, beta, scale=scale,
                                                                  cu_seqlens=cu_long if packed else None)[0]
    gdn["FlashQLA 0.1.3"] = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g_gdn, beta, scale=scale,
                                                                      cu_seqlens=cu_long if packed else None)[0]
    runs["GDN"] = gdn
    for op, fns in runs.items():
        g = g_kda if op == "KDA" else g_gdn
        floor = floor_ms(T, HQ, H, g, beta)
        ours = fns["kda"]().double()
        ms = {name: median_ms(fn) for name, fn in fns.items()}
        for name, fn in fns.items():
            same_math = not name.startswith("kda, one sequence")       # one sequence carries the state across
            table.rows.append([text(zh={"96 random lengths": "96 条随机长度的序列",
                                        "1024 sequences of 1 to 64 tokens": "1024 条 1 到 64 个 token 的序列",
                                        "grouped value heads, 16 / 32": "分组的 value head，16 / 32"}.get(case, case),
                                    en=case), op,
                               text(zh={"kda, one sequence of the same tokens": "kda，同样的 token "
                                                                                "作为一条序列"}.get(name, name),
                                    en=name),
                               ms[name], ms[name] / ms["kda"], floor / ms[name],
                               (0.0 if name == "kda" else rel_l2(fn(), ours)) if same_math else "—"])
        rows.append({"op": op, "case": case, "B": 1, "T": T, "H": H, "HQ": HQ, "DK": D, "DV": D,
                     "sequences": len(lens), "ms": ms, "floor": floor})
    del q, k, v, beta, g_kda, g_gdn
    torch.cuda.empty_cache()
print(table)
print(text(zh="\n「kda 快的倍数」= 该实现的时间除以 kda（打包调用）的时间；"
              "「同样的 token 作为一条序列」是不打包时的时间，"
              "打包调用以它为对照；下限计入 q、k、v、o、g 与 beta 各一次，以及 delta 规则的 FLOPs。",
           en="\n`kda faster by` = that implementation's time over kda's (packed); `one sequence of the same tokens` "
           "is the unpacked time the packed call is measured against; the floor counts q, k, v, o, g and beta once, "
           "and the delta rule's FLOPs."))
save_data({"rows": rows})
