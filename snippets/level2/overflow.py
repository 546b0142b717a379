# snippet: cpu
"""The factor alpha^-(C-1) that the factorized form needs, and the largest exponent each format holds."""
from kda.tables import level2

print(level2.overflow())
