# snippet: gpu
"""kda.decay_attention (level 3's scalar pass, the decay constant) against the float64 reference on
the H200 for several decays (one per head included), tails, DK != DV, both dtypes, outputs
poisoned with NaN. Then the per-chunk error along one long sequence for three decays: with a < 1
the old state, and the error the bf16/fp16 copy of it carried, fades by a^64 per chunk (saved for
the plot)."""
import torch

from kda import launch
from kda.ops import decay_attention
from kda.metrics import rel_l2
from kda.reference import level2 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci

launch.poison_outputs = True
torch.manual_seed(0)
NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
H = 4
DECAYS = {"1.0": 1.0, "0.99": 0.99, "0.9": 0.9, "0.5": 0.5,
          text(zh="每个 head 1-2^-(5+h)", en="per head 1-2^-(5+h)"):
              (1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))).tolist()}

table = Table(["alpha", "B, T, H, DK, DV", "dtype", "rel L2", text(zh="出现 NaN 或 inf", en="NaN or inf")],
              formats=[None, None, None, sci, None])
for label, alpha in DECAYS.items():
    a = torch.tensor(alpha, dtype=torch.float64) if isinstance(alpha, list) else alpha
    for B, T, DK, DV in [(2, 1000, 128, 128), (1, 4133, 64, 64), (3, 700, 128, 64)]:
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = (torch.randn(B, T, H, d, device="cuda").to(dtype) for d in (DK, DK, DV))
            out = decay_attention(q, k, v, a, scale=1.0)
            expected, _ = ref.chunked(q, k, v, a)
            table.rows.append([label, f"{B}, {T}, {H}, {DK}, {DV}", NAMES[dtype], rel_l2(out, expected),
                               text(zh="否", en="no") if torch.isfinite(out).all() else text(zh="是", en="yes")])
print(table)

B, T, D, C = 1, 32768, 128, 64
profile = {}
q, k, v = (torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16) for _ in range(3))
for alpha in (1.0, 0.99, 0.9):
    expected, _ = ref.chunked(q, k, v, alpha)
    out = decay_attention(q, k, v, alpha, scale=1.0).double()
    diff = (out - expected).reshape(B, T // C, C, H, D).pow(2).sum(dim=(0, 2, 3, 4)).sqrt()
    norm = expected.reshape(B, T // C, C, H, D).pow(2).sum(dim=(0, 2, 3, 4)).sqrt()
    profile[str(alpha)] = (diff / norm).tolist()
save_data({"chunk_size": C, "T": T, "dtype": "bf16", "per_chunk_rel_l2": profile})
n = T // C
print(text(zh=f"\n沿 T = {T} 逐块的误差，bf16（H = {H}, D = {D}）：\n",
           en=f"\nPer-chunk error along T = {T}, bf16 (H = {H}, D = {D}):\n"))
print(text(zh="| alpha | 第 0 块 | 第 3 块 | 第 %d 块 | 第 %d 块 |\n|---|---|---|---|---|" % (n // 2, n - 1),
           en="| alpha | chunk 0 | chunk 3 | chunk %d | chunk %d |\n|---|---|---|---|---|" % (n // 2, n - 1)))
for alpha, errs in profile.items():
    print(f"| {alpha} | {sci(errs[0])} | {sci(errs[3])} | {sci(errs[n // 2])} | {sci(errs[-1])} |")
