"""Level-4 tables: how well conditioned the chunk's triangular system ``I + A`` is."""

from __future__ import annotations

import torch

from kda.reference import level4 as ref
from kda.reference.common import to_chunks
from kda.site.runtime import text
from kda.tables import Table, sci


# --8<-- [start:solve_conditioning]
def solve_conditioning(C: int = 64, D: int = 128, chunks: int = 64, seed: int = 0) -> Table:
    """``A = tril(diag(b) K K^T, -1)`` for random chunks, keys L2-normalized or raw N(0, 1),
    ``b`` uniform in [0, 1]: the 2-norm condition number of ``I + A``, the largest entry of
    its inverse, and the error of the blocked inverse computed in float32 against float64's
    ``solve_triangular``."""
    gen = torch.Generator().manual_seed(seed)
    table = Table([text(zh="键", en="keys"), text(zh="cond(I + A)，中位数", en="cond(I + A), median"),
                   text(zh="cond(I + A)，最大值", en="cond(I + A), max"),
                   text(zh="(I + A)^-1 的最大元素", en="largest entry of (I + A)^-1"),
                   text(zh="fp32 分块求逆：相对误差", en="blocked inverse in fp32: rel error")],
                  formats=[None, sci, sci, sci, sci])
    for unit, name in ((True, text(zh="L2 归一化", en="L2-normalized")),
                       (False, text(zh="原始 N(0, 1)", en="raw N(0, 1)"))):
        k = torch.randn(1, chunks * C, 1, D, generator=gen, dtype=torch.float64)
        if unit:
            k = ref.l2_normalize(k)
        beta = torch.rand(1, chunks * C, 1, generator=gen, dtype=torch.float64)
        A = ref.scaled_kkt(to_chunks(k, C), to_chunks(beta[..., None], C)[..., 0])
        eye = torch.eye(C, dtype=torch.float64)
        exact = torch.linalg.solve_triangular(eye + A, eye.expand(A.shape), upper=False, unitriangular=True)
        cond = torch.linalg.cond(eye + A)
        blocked = ref.invert_unit_lower_blocked(A.float(), 16).double()
        err = ((blocked - exact).flatten(-2).norm(dim=-1) / exact.flatten(-2).norm(dim=-1)).max().item()
        table.rows.append([name, cond.median().item(), cond.max().item(), exact.abs().max().item(), err])
    return table
# --8<-- [end:solve_conditioning]
