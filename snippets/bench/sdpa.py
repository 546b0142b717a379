# snippet: gpu
"""Context for the benchmarks: causal softmax attention (torch SDPA, flash backend) on the H200,
bf16, B = 1, H = 32, D = 128, same lengths as the linear-attention kernels. Median of many runs."""
import torch
import torch.nn.functional as F

from kda import ledger
from kda.bench import median_ms
from kda.site.runtime import save_data, text
from kda.tables import Table

B, H, D = 1, 32, 128
rows, data = [], []
gen = torch.Generator(device="cuda").manual_seed(0)
for T in (2048, 8192, 32768, 65536):
    q, k, v = (torch.randn(B, H, T, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), warmup_ms=50, rep_ms=300)
    flops = B * H * ledger.causal_attention_flops(T, D)
    floor = ledger.floor_seconds(flops, ledger.forward_min_bytes(B, T, H, D, D)) * 1e3
    rows.append([T, ms, flops / (ms * 1e-3) / 1e12, floor, floor / ms])
    data.append(dict(T=T, sdpa=ms, floor=floor))
save_data({"B": B, "H": H, "D": D, "rows": data})
print(Table(["T", text(zh="SDPA 因果（ms）", en="SDPA causal (ms)"),
             text(zh="实际达到的 TFLOP/s", en="achieved TFLOP/s"),
             text(zh="下限（ms）", en="floor (ms)"), text(zh="达到下限的比例", en="at % of floor")], rows,
            [None, "{:.3f}", "{:.0f}", "{:.3f}", "{:.0%}"]))
