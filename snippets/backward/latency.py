# snippet: gpu
"""Forward + backward latency on the H200, bf16: one step (the op, then the gradients of q, k, v, g
and beta for a random dO) of kda's chunk_kda and chunk_gated_delta_rule with their defaults, against
fla's chunk_kda, fla's own Triton GDN (FLA_FLASH_QLA=0) and FlashQLA 0.1.3, same inputs in one
process: unit keys, beta uniform in [0, 1], float32 gates logsigmoid(x). The median of do_bench
after a long warm-up (fla and FlashQLA compile and autotune their backward for each new shape);
the peak memory is what the step allocates above its inputs."""
import os

import torch

import kda
from kda import ledger
from kda.bench import median_ms
from kda.metrics import rel_l2
from kda.reference import level4 as ref4
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
from fla.ops.kda import chunk_kda as fla_kda
import flash_qla

assert os.environ.get("FLA_FLASH_QLA") == "0", "run with FLA_FLASH_QLA=0 so that fla's GDN is its own Triton path"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128)]   # (B, T, H, D)
C = 64


def inputs(B, T, H, D, per_channel, seed=7):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, v = rand(B, T, H, D).bfloat16(), rand(B, T, H, D).bfloat16()
    k = ref4.l2_normalize(rand(B, T, H, D)).bfloat16()
    g = torch.nn.functional.logsigmoid(rand(B, T, H, *([D] if per_channel else [])))
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    do = rand(B, T, H, D).bfloat16()
    return [x.requires_grad_() for x in (q, k, v, g, beta)], do


def step(fn, leaves, do, scale):
    return lambda: torch.autograd.grad(fn(*leaves, scale=scale)[0], leaves, do)


def peak_mb(run):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def floor_ms(leaves, do, B, T, H, D):
    """HBM: every input read twice (forward and backward), o written, dO read, every gradient written;
    FLOPs: the forward's three times (the backward's GEMMs are twice the forward's)."""
    inputs_bytes = sum(x.numel() * x.element_size() for x in leaves)
    nbytes = 3 * inputs_bytes + 2 * do.numel() * do.element_size()
    return ledger.floor_seconds(3 * ledger.forward_flops(B, T, H, D, D, C, delta=True), nbytes) * 1e3


OPS = [("KDA", True, {"kda": kda.chunk_kda, "fla chunk_kda": fla_kda}),
       ("GDN", False, {"kda": kda.chunk_gated_delta_rule, "fla (Triton)": fla_gdn,
                       "FlashQLA 0.1.3": flash_qla.chunk_gated_delta_rule})]
table = Table([text(zh="算子", en="op"), "B, T, H, D", text(zh="实现", en="implementation"), "ms",
               text(zh="kda 快的倍数", en="kda faster by"), text(zh="达到下限的比例", en="at % of floor"),
               text(zh="峰值显存 MB", en="peak MB"), text(zh="dq…dbeta 对比 kda 的最大 rel L2", en="max rel L2 vs kda")],
              formats=[None, None, None, "{:.2f}", "{:.2f}x", "{:.1%}", "{:.0f}", sci])
rows = []
for op, per_channel, impls in OPS:
    for B, T, H, D in SHAPES:
        leaves, do = inputs(B, T, H, D, per_channel)
        scale, floor = D ** -0.5, floor_ms(leaves, do, B, T, H, D)
        runs = {name: step(fn, leaves, do, scale) for name, fn in impls.items()}
        ours = runs["kda"]()
        ms = {name: median_ms(run, warmup_ms=2000, rep_ms=2000) for name, run in runs.items()}
        for name, run in runs.items():
            got = run()
            diff = max(rel_l2(a.float(), b.float()) for a, b in zip(got, ours))
            table.rows.append([op, f"{B}, {T}, {H}, {D}", name, ms[name], ms[name] / ms["kda"],
                               floor / ms[name], peak_mb(run), diff])
            rows.append({"op": op, "B": B, "T": T, "H": H, "D": D, "impl": name, "ms": ms[name],
                         "floor_ms": floor, "peak_MB": table.rows[-1][6], "max_rel_l2_vs_kda": diff})
        del leaves, do, runs, ours
        torch.cuda.empty_cache()
print(table)
print(text(zh="\n「kda 快的倍数」= 该实现的时间除以 kda 的时间（小于 1 即 kda 更慢）；下限计入每个输入读两次、o 写一次、"
              "dO 读一次、每个梯度写一次，以及前向 FLOPs 的三倍。",
           en="\n`kda faster by` = that implementation's time over kda's (below 1: kda is slower); the floor counts "
              "every input read twice, o written once, dO read once, every gradient written once, and three "
              "times the forward's FLOPs."))
save_data({"rows": rows})
