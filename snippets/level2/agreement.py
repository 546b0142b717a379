# snippet: cpu
"""The level-2 references against the recurrence in float64 (the article's sizes: B = 2, H = 2,
T = 12, D = 4, C = 4, alpha = 0.9), the alpha = 1 degeneration, and the matrix form with
per-token decays alpha_t ~ U(0.85, 0.999)."""
from kda.tables import level2

print(level2.agreement(seed=0, alpha=0.9))
print()
print(level2.per_token(seed=0, low=0.85, high=0.999))
