# snippet: gpu
"""The level-4 kernels against the float64 references on the H200: the whole forward against the
token recurrence (both dtypes, tails, DK != DV, b from 0 to 1, an initial state, outputs poisoned
with NaN), and the solve alone, both merges, against torch.linalg.solve_triangular in float64."""
import torch

from kda import launch
from kda.delta import delta_rule
from kda.kernels.wy_solve import chunk_wy
from kda.kernels.build import compile_program
from kda.metrics import rel_l2
from kda.reference import level4 as ref
from kda.reference.common import to_chunks
from kda.site.runtime import text
from kda.tables import Table, sci

launch.poison_outputs = True
torch.manual_seed(0)
NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
B, T, H, DK, DV = 2, 1000, 4, 128, 64
table = Table(["b", "dtype", "rel L2 o", text(zh="rel L2 最终状态", en="rel L2 final state"),
               text(zh="出现 NaN 或 inf", en="NaN or inf")], formats=[None, None, sci, sci, None])
for label, (lo, hi) in {"0": (0, 0), text(zh="[0, 1] 上均匀分布", en="uniform in [0, 1]"): (0, 1),
                        "1": (1, 1)}.items():
    for dtype in (torch.float16, torch.bfloat16):
        q = torch.randn(B, T, H, DK, device="cuda").to(dtype)
        k = ref.l2_normalize(torch.randn(B, T, H, DK, device="cuda")).to(dtype)
        v = torch.randn(B, T, H, DV, device="cuda").to(dtype)
        beta = lo + (hi - lo) * torch.rand(B, T, H, device="cuda")
        h0 = torch.randn(B, H, DK, DV, device="cuda")
        o, ht = delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True)
        ref_o, ref_ht = ref.recurrent(q.double() * DK ** -0.5, k, v, beta, h0, True)
        table.rows.append([label, NAMES[dtype], rel_l2(o, ref_o), rel_l2(ht, ref_ht),
                           text(zh="否", en="no") if torch.isfinite(o).all() and torch.isfinite(ht).all()
                           else text(zh="是", en="yes")])
print(text(zh=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}；单位键；scale = DK^-0.5\n",
           en=f"B, T, H, DK, DV = {B}, {T}, {H}, {DK}, {DV}; unit keys; scale = DK^-0.5\n"))
print(table)

# the solve alone: with write_inverse, chunk_wy also writes the float32 inverse it used
k = ref.l2_normalize(torch.randn(1, 4096, 8, 128, device="cuda")).bfloat16()
v = torch.randn(1, 4096, 8, 128, device="cuda").bfloat16()
beta = torch.rand(1, 4096, 8, device="cuda")
A = ref.scaled_kkt(to_chunks(k.double(), 64), to_chunks(beta.double()[..., None], 64)[..., 0])
eye = torch.eye(64, dtype=torch.float64, device="cuda")
exact = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
solve = Table([text(zh="合并", en="merge"), text(zh="运算", en="arithmetic"),
               text(zh="(I + A)^-1 的 rel L2", en="rel L2 of (I + A)^-1"),
               text(zh="最大绝对误差", en="max abs error")],
              formats=[None, None, sci, sci])
for merge, arithmetic in [("substitution", text(zh="float32，CUDA core", en="float32, CUDA cores")),
                          ("products", text(zh="tf32 GEMM，操作数经过舍入", en="tf32 GEMMs, operands rounded"))]:
    W, U = torch.empty_like(k), torch.empty_like(v)
    Ainv = torch.full((1, 4096, 8, 64), float("nan"), device="cuda")
    compile_program(chunk_wy, (), DK=128, DV=128, chunk_size=64, dtype="bfloat16", merge=merge,
                    write_inverse=True)(k, v, beta, W, U, Ainv, torch.zeros(2, dtype=torch.int32, device="cuda"))
    got = to_chunks(Ainv.double(), 64)
    solve.rows.append([merge, arithmetic, rel_l2(got, exact), (got - exact).abs().max().item()])
print(text(zh="\n单独的求解（512 个 64 行的块，bf16 单位键，b 在 [0, 1] 内），对照 float64 的 solve_triangular：\n",
           en="\nThe solve alone (512 chunks of 64, bf16 unit keys, b in [0, 1]) against float64 "
              "solve_triangular:\n"))
print(solve)
