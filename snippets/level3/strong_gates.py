# snippet: cpu
"""One chunk (C = 64, D = 64) under strong gates: the single-GEMM factorization against the
sub-chunk scheme of kda.reference.level3.intra_by_subchunks (reference point between
sub-chunks, pairwise on the diagonal), each against the pairwise definition."""
from kda.tables import level3

print(level3.strong_gates())
