# snippet: cpu
"""How well conditioned the chunk's triangular system I + A is, with unit and with raw keys
(C = 64, D = 128, b uniform in [0, 1], 64 random chunks), and how far a float32 blocked inverse
lands from float64's solve_triangular."""
from kda.tables import level4

print(level4.solve_conditioning())
