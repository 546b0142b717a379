# snippet: cpu
"""Measured: where the single-GEMM factorization of the per-channel intra scores,
(Q e^G)(K e^-G)^T, stops working, for constant gates g per step (bisection on |g|, failure =
inf/NaN or a relative error above 1e-2 against the pairwise definition). The key factor
e^(-G_j) grows to e^((C-1)|g|): the failure sits where that leaves the operand's range."""
from kda.tables import level3

print(level3.factorization_limits())
