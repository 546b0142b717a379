# snippet: gpu
"""The level-3 kernels against the float64 reference on the H200: both gate forms, both dtypes,
gates from mild to extreme, a tail (T = 1000 is 15 chunks and 40 tokens), DK != DV, an initial
state, outputs poisoned with NaN before every launch. Then short sequences, where the diagonal
scores (and so the diagonal GEMM of the per-channel path) carry most of the output."""
import torch

from kda import launch
from kda.gated import gated_attention
from kda.kernels.stages import DIAGONAL_SPAN_MAX
from kda.kernels.chunk_intra import SUBCHUNK
from kda.metrics import rel_l2
from kda.reference import level3 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

launch.poison_outputs = True
torch.manual_seed(0)
NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
SPAN_MAX = DIAGONAL_SPAN_MAX      # the per-channel kernel's span bound on a diagonal sub-chunk (log2)


def gates(kind, shape):
    """Log decays: near 0; logsigmoid of a normal (GLA's gate); uniform down to -20 per step;
    runs of 37 steps at -20 between runs at -0.01."""
    if kind == "mild":
        return -0.05 * torch.rand(shape, device="cuda")
    if kind == "logsigmoid":
        return torch.nn.functional.logsigmoid(torch.randn(shape, device="cuda"))
    if kind == "uniform to -20":
        return -20 * torch.rand(shape, device="cuda")
    steps = torch.arange(shape[1], device="cuda").view(1, -1, *[1] * (len(shape) - 2))
    return torch.where(steps // 37 % 3 == 0, -20.0, -0.01).expand(shape).contiguous()


def steep_share(g, C=64):
    """Share of chunks whose per-channel diagonal scores take the pairwise path: some sub-chunk
    where the gate falls by more than SPAN_MAX (log2 units) from the row before it to its end."""
    B, T, H, D = g.shape
    G = ref.chunk_gates(g.double() / torch.log(torch.tensor(2.0)), C)         # [B, H, NC, C, D]
    before = torch.cat([torch.zeros_like(G[..., :1, :]), G[..., SUBCHUNK - 1:-1:SUBCHUNK, :]], dim=-2)
    span = before - G[..., SUBCHUNK - 1::SUBCHUNK, :]
    return (span.amax(dim=(-1, -2)) > SPAN_MAX).double().mean().item()


B, T, H, DK, DV = 2, 1000, 4, 128, 64
table = Table([text(zh="门控", en="gate"), text(zh="形式", en="form"), "dtype", "rel L2 o",
               text(zh="rel L2 最终状态", en="rel L2 final state"),
               text(zh="走逐对路径的块", en="chunks on the pairwise path"),
               text(zh="出现 NaN 或 inf", en="NaN or inf")], formats=[None, None, None, sci, sci, None, None])
for kind in ("mild", "logsigmoid", "uniform to -20", "runs of -20"):
    for form in ("scalar", "per channel"):
        g = gates(kind, (B, T, H) if form == "scalar" else (B, T, H, DK))
        for dtype in (torch.float16, torch.bfloat16):
            q, k = (torch.randn(B, T, H, DK, device="cuda").to(dtype) for _ in range(2))
            v = torch.randn(B, T, H, DV, device="cuda").to(dtype)
            h0 = torch.randn(B, H, DK, DV, device="cuda")
            o, ht = gated_attention(q, k, v, g, initial_state=h0, output_final_state=True)
            expected, expected_ht = ref.chunked(q.double() * DK ** -0.5, k, v, g, initial_state=h0,
                                                output_final_state=True)
            share = f"{steep_share(g):.0%}" if form == "per channel" else "-"
            table.rows.append([text(zh={"mild": "温和", "uniform to -20": "均匀分布到 -20",
                                        "runs of -20": "成段的 -20"}.get(kind, kind), en=kind),
                               text(zh={"scalar": "标量", "per channel": "逐通道"}.get(form, form), en=form),
                               NAMES[dtype], rel_l2(o, expected), rel_l2(ht, expected_ht), share,
                               text(zh="否", en="no") if torch.isfinite(o).all() and torch.isfinite(ht).all()
                               else text(zh="是", en="yes")])
print(text(zh=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}；scale = DK^-0.5；初始状态 N(0, 1)\n",
           en=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}; scale = DK^-0.5; initial state N(0, 1)\n"))
print(table)

short = Table(["T", text(zh="门控", en="gate"), text(zh="形式", en="form"), "dtype", "rel L2 o"],
              formats=[None, None, None, None, sci])
for T_short in (1, 16, 65):
    for dtype in (torch.float16, torch.bfloat16):
        for form in ("scalar", "per channel"):
            g = gates("logsigmoid", (1, T_short, H) if form == "scalar" else (1, T_short, H, DK))
            q, k, v = (torch.randn(1, T_short, H, DK, device="cuda").to(dtype) for _ in range(3))
            o = gated_attention(q, k, v, g)
            short.rows.append([T_short, "logsigmoid",
                               text(zh={"scalar": "标量", "per channel": "逐通道"}.get(form, form), en=form),
                               NAMES[dtype],
                               rel_l2(o, ref.recurrent(q.double() * DK ** -0.5, k, v, g)[0])])
print(text(zh="\n短序列（B = 1, H = 4, D = 128），对照逐 token 递推：\n",
           en="\nShort sequences (B = 1, H = 4, D = 128), against the token recurrence:\n"))
print(short)
