# snippet: cpu
"""The chunk step of the math article, written as it is printed and corrected, run on one chunk
with a zero start state and compared with the token recurrence (float64, KDA gates).

As printed: A is masked on the diagonal only, and the output uses K where it needs K e^-G."""
import torch

from kda.metrics import rel_l2
from kda.reference import level0 as ref
from kda.site.runtime import text
from kda.tables import Table, sci

gen = torch.Generator().manual_seed(0)
C, DK, DV = 16, 8, 8
Q, V = torch.randn(C, DK, generator=gen, dtype=torch.float64), torch.randn(C, DV, generator=gen, dtype=torch.float64)
K = torch.nn.functional.normalize(torch.randn(C, DK, generator=gen, dtype=torch.float64), dim=-1)
g = torch.cumsum(-0.2 * torch.rand(C, DK, generator=gen, dtype=torch.float64), 0)   # cumulative gate
beta = torch.rand(C, generator=gen, dtype=torch.float64)
I = torch.eye(C, dtype=torch.float64)


def chunk_step(solve, strict_lower, output_keys):
    K_exp, K_inv = K * torch.exp(g), K * torch.exp(-g)
    A = K_exp @ K_inv.T
    A = A.tril(-1) if strict_lower else A.masked_fill(I.bool(), 0.0)        # printed: diagonal only
    L = I + A * beta[:, None]
    U = solve(L, V * beta[:, None])
    W = solve(L, K_exp * beta[:, None])
    K_decayed = K * torch.exp(g[-1] - g)
    M = torch.diag(torch.exp(g[-1])) - K_decayed.T @ W
    B = K_decayed.T @ U
    keys = K if output_keys == "K" else K_inv                                # printed: K
    O_local = (Q * torch.exp(g) @ keys.T).tril() @ U
    return M, B, O_local


# the truth: the token recurrence from S = 0 (per-step gates recovered from the cumulative g)
step = torch.diff(g, dim=0, prepend=torch.zeros(1, DK, dtype=torch.float64))
o_true, s_true = ref.recurrent(Q[None, :, None], K[None, :, None], V[None, :, None], step[None, :, None],
                               beta[None, :, None], None, True)
o_true, s_true = o_true[0, :, 0], s_true[0, 0]
M_true, B_true = ref.chunk_affine(K, V, step, beta)

table = Table([text(zh="版本", en="version"), text(zh="M 对比 chunk_affine", en="M vs chunk_affine"),
               text(zh="B 对比最终状态", en="B vs final state"),
               text(zh="O_local 对比递推", en="O_local vs recurrence")], formats=[None, sci, sci, sci])
versions = [(text(zh="照原样，用 torch.linalg.solve 求解", en="as printed, solved with torch.linalg.solve"),
             torch.linalg.solve, False, "K"),
            (text(zh="照原样，用前向代入", en="as printed, with a forward substitution"),
             ref.forward_substitution, False, "K"),
            (text(zh="改正后：tril(-1)，输出中用 K e^-G", en="corrected: tril(-1), and K e^-G in the output"),
             ref.forward_substitution, True, "K_inv")]
for name, solve, strict, keys in versions:
    M, B, O = chunk_step(solve, strict, keys)
    table.rows.append([name, rel_l2(M, M_true), rel_l2(B, s_true), rel_l2(O, o_true)])
print(table)
