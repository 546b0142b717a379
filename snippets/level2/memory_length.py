# snippet: cpu
"""Effective memory length: tokens until a contribution has decayed to 1e-3."""
from kda.tables import level2

print(level2.memory_length(C=64, threshold=1e-3))
