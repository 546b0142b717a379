# snippet: gpu
"""The two level-1 kernels and kda.linear_attention (level 3's pass without a gate) against the
float64 reference on the H200: fresh random inputs, tails (T not a multiple of 64), DK != DV, both
dtypes; outputs poisoned with NaN before each launch. Then the error of every chunk along one long
sequence for linear_attention (saved for the plot below)."""
import torch

from kda import launch
from kda.ops import linear_attention
from kda.kernels.chapters import linear_attention as kernels
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level1 as ref
from kda.site.runtime import save_data, text
from kda.tables import Table, sci

launch.poison_outputs = True
torch.manual_seed(0)
NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}

no_state = torch.empty(1, 1, 1, 1, device="cuda")    # h0 and ht of a kernel compiled without states

def fused_kernel(q, k, v):
    kernel = compile_program(kernels.seq_in_loop, (), DK=q.shape[-1], DV=v.shape[-1], dtype=launch.dtype_name(q.dtype))
    o = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    kernel(q, k, v, 1.0, no_state, o, no_state)
    return o

def grid_kernel(q, k, v):
    kernel = compile_program(kernels.seq_in_grid, (), DK=q.shape[-1], DV=v.shape[-1], dtype=launch.dtype_name(q.dtype))
    o = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    kernel(q, k, v, o)
    return o

table = Table(["B, T, H, DK, DV", "dtype", "linear_attention rel L2", "seq_in_loop rel L2", "seq_in_grid rel L2",
               text(zh="出现 NaN 或 inf", en="NaN or inf")], formats=[None, None, sci, sci, sci, None])
for B, T, H, DK, DV in [(2, 1000, 4, 128, 128), (1, 4133, 8, 64, 64), (3, 2000, 2, 128, 64), (1, 77, 16, 64, 128)]:
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(B, T, H, d, device="cuda").to(dtype) for d in (DK, DK, DV))
        expected, _ = ref.chunked(q, k, v)
        outputs = [linear_attention(q, k, v, scale=1.0), fused_kernel(q, k, v), grid_kernel(q, k, v)]
        bad = not all(torch.isfinite(o).all() for o in outputs)
        table.rows.append([f"{B}, {T}, {H}, {DK}, {DV}", NAMES[dtype], *(rel_l2(o, expected) for o in outputs),
                           text(zh="是", en="yes") if bad else text(zh="否", en="no")])
print(table)

# error of each chunk along one sequence: does it grow with the chunk index?
B, T, H, D, C = 1, 32768, 4, 128, 64
profile = {}
for dtype in (torch.float16, torch.bfloat16):
    q, k, v = (torch.randn(B, T, H, D, device="cuda").to(dtype) for _ in range(3))
    expected, _ = ref.chunked(q, k, v)
    fused = linear_attention(q, k, v, scale=1.0).double()
    diff = (fused - expected).reshape(B, T // C, C, H, D).pow(2).sum(dim=(0, 2, 3, 4)).sqrt()
    norm = expected.reshape(B, T // C, C, H, D).pow(2).sum(dim=(0, 2, 3, 4)).sqrt()
    profile[NAMES[dtype]] = (diff / norm).tolist()
save_data({"chunk_size": C, "T": T, "per_chunk_rel_l2": profile})
print(text(zh=f"\n沿 T = {T} 逐块的误差（H = {H}, D = {D}）：第一块、中间一块、最后一块",
           en=f"\nPer-chunk error along T = {T} (H = {H}, D = {D}): first chunk, middle, last"))
print(text(zh="\n| dtype | 第 0 块 | 第 %d 块 | 第 %d 块 |\n|---|---|---|---|" % (T // C // 2, T // C - 1),
           en="\n| dtype | chunk 0 | chunk %d | chunk %d |\n|---|---|---|---|" % (T // C // 2, T // C - 1)))
for name, errs in profile.items():
    print(f"| {name} | {sci(errs[0])} | {sci(errs[len(errs) // 2])} | {sci(errs[-1])} |")
