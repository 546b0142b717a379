# snippet: cpu
"""One chunk's intra term in fp16 (C = 64, d = 64, 20 random inputs, median rel L2 vs float64)."""
from kda.tables import level2

print(level2.fp16_single_chunk(C=64, D=64, trials=20, seed=0))
