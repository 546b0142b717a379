# snippet: cpu
"""The four level-1 references against each other in float64 (article 000, section 3.4)."""
from kda.tables import level1

print(level1.agreement(seed=0, B=2, T=12, H=2, D=4, chunk_size=4))
