# snippet: cpu
"""What context parallelism does with the affine maps: every "rank" holds a slice of the
sequence, computes its map (M_r, B_r) from a zero state, the maps are folded in order, and each
rank starts from its true state. Checked in float64 against the single-process recurrence, with
uneven slices; then what one rank sends in an all-gather of the maps (fp32)."""
import torch

from kda.metrics import rel_l2
from kda.reference import level0 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

gen = torch.Generator().manual_seed(1)
B, H, DK, DV, C = 1, 2, 16, 8, 16
slices = [37, 64, 5, 50]                             # uneven slices of T = 156 over 4 ranks
T = sum(slices)
q, v = (torch.randn(B, T, H, d, generator=gen, dtype=torch.float64) for d in (DK, DV))
k = torch.nn.functional.normalize(torch.randn(B, T, H, DK, generator=gen, dtype=torch.float64), dim=-1)
g = -0.2 * torch.rand(B, T, H, DK, generator=gen, dtype=torch.float64)
beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
o_ref, s_ref = ref.recurrent(q, k, v, g, beta, None, True)


def slice_map(lo, hi):
    """One rank's map, chunk by chunk, composed (a zero start state is not needed for M, B)."""
    eye = torch.eye(DK, dtype=torch.float64).expand(B, H, DK, DK)
    total = (eye, torch.zeros(B, H, DK, DV, dtype=torch.float64))
    for s in range(lo, hi, C):
        e = min(s + C, hi)
        part = [x[:, s:e].transpose(1, 2) for x in (k, v, g)] + [beta[:, s:e].transpose(1, 2)]
        total = ref.compose(total, ref.chunk_affine(*part))
    return total


bounds = [sum(slices[:r]) for r in range(len(slices) + 1)]
maps = [slice_map(bounds[r], bounds[r + 1]) for r in range(len(slices))]      # step 1, in parallel
state = torch.zeros(B, H, DK, DV, dtype=torch.float64)
outputs = []
for r, (M, Bm) in enumerate(maps):                                            # steps 2-3: gather, fold
    lo, hi = bounds[r], bounds[r + 1]
    o, _ = ref.chunked(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], C, state)  # step 4
    outputs.append(o)
    state = M @ state + Bm
table = Table([text(zh="检验", en="check"), "rel L2"], formats=[None, sci])
table.rows.append([text(zh=f"输出，{len(slices)} 个 rank，各段长度 {slices}",
                        en=f"outputs, {len(slices)} ranks with slices {slices}"),
                   rel_l2(torch.cat(outputs, dim=1), o_ref)])
table.rows.append([text(zh="折叠后的最终状态", en="final state after the fold"), rel_l2(state, s_ref)])
print(table)

print()
sent = Table(["H", "D", text(zh="一个 rank 发出的字节数：H (D^2 + D^2) fp32",
                             en="bytes one rank sends: H (D^2 + D^2) fp32")],
             formats=[None, None, "{:,}"])
for heads, d in [(32, 128), (64, 128), (16, 64)]:
    sent.rows.append([heads, d, heads * (d * d + d * d) * 4])
print(sent)
