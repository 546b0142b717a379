# snippet: gpu
"""GDN latency on the H200, bf16, unit keys, b uniform in [0, 1], float32 gates logsigmoid(x), one
per head: kda's chunk_gated_delta_rule against fla's (its own Triton path, FLA_FLASH_QLA=0) and
FlashQLA 0.1.3, at the shapes of the KDA table, in one process on the same inputs. kda's two GDN paths
are timed apart too: level 5's (``chunk_intra``'s scalar path, then the state pass) and the
scalar-gate path (``kda/kernels/scalar_gate.py``); the ``kda`` row is the one the call picks."""
import os

import torch

from kda import gated_delta, ledger
from kda.bench import median_ms, random_qkv
from kda.gated_delta import chunk_gated_delta_rule
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
import flash_qla

assert os.environ.get("FLA_FLASH_QLA") == "0", "run with FLA_FLASH_QLA=0 so that fla's GDN is its own Triton path"
SHAPES = [(1, 32768, 32, 128), (1, 8192, 96, 128), (4, 4096, 64, 128)]   # (B, T, H, D)
C = 64

table = Table(["B, T, H, D", text(zh="实现", en="implementation"), "ms", text(zh="kda 快的倍数", en="kda faster by"),
               text(zh="达到下限的比例", en="at % of floor"), text(zh="rel L2 对比 kda", en="rel L2 vs kda")],
              formats=[None, None, "{:.3f}", "{:.2f}x", "{:.0%}", sci])
LABELS = {"kda, level 5's path": text(zh="kda，第五级的路径", en="kda, level 5's path"),
          "kda, scalar-gate path": text(zh="kda，标量门控路径", en="kda, scalar-gate path")}


def by_path(scalar_gate, *inputs):
    """kda's GDN by one of its two paths whatever the shape (``kda.gated_delta``'s switch and block rule)."""
    def run():
        saved = gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_MIN_BLOCKS
        gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_MIN_BLOCKS = scalar_gate, 0.0
        try:
            return chunk_gated_delta_rule(*inputs)[0]
        finally:
            gated_delta.SCALAR_GATE_PATH, gated_delta.SCALAR_GATE_MIN_BLOCKS = saved
    return run


rows = []
for B, T, H, D in SHAPES:
    q, k, v = random_qkv(B, T, H, D, D, seed=7)
    k = ref.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(9)
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
    scale = D ** -0.5
    fns = {"kda": lambda: chunk_gated_delta_rule(q, k, v, g, beta)[0],
           "kda, check_values=False": lambda: chunk_gated_delta_rule(q, k, v, g, beta, check_values=False)[0],
           "kda, level 5's path": by_path(False, q, k, v, g, beta),
           "kda, scalar-gate path": by_path(True, q, k, v, g, beta),
           "fla chunk_gated_delta_rule (Triton)": lambda: fla_gdn(q, k, v, g, beta, scale=scale)[0],
           "FlashQLA 0.1.3": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0]}
    nbytes = (ledger.forward_min_bytes(B, T, H, D, D) + g.numel() * g.element_size()
              + beta.numel() * beta.element_size())
    floor = ledger.floor_seconds(ledger.forward_flops(B, T, H, D, D, C, delta=True), nbytes) * 1e3
    ours = fns["kda"]().double()
    ms = {name: median_ms(fn) for name, fn in fns.items()}
    for name, fn in fns.items():
        table.rows.append([f"{B}, {T}, {H}, {D}", LABELS.get(name, name), ms[name], ms[name] / ms["kda"],
                           floor / ms[name], 0.0 if name == "kda" else rel_l2(fn(), ours)])
    rows.append({"op": "GDN", "B": B, "T": T, "H": H, "DK": D, "DV": D, "ms": ms, "floor": floor})
print(table)
print(text(zh="\n「kda 快的倍数」= 该实现的时间除以 kda 的时间；下限计入 q、k、v、o、g 与 beta 各一次，"
              "以及 delta 规则的 FLOPs。",
           en="\n`kda faster by` = that implementation's time over kda's; the floor counts q, k, v, o, g and beta "
           "once, and the delta rule's FLOPs."))
save_data({"rows": rows})
