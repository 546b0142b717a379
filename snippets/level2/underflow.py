# snippet: cpu
"""The ratio form's own limits: the range of Gamma in fp32 (C = 128), and its smallest entry if
Gamma were stored in fp16."""
from kda.tables import level2

print(level2.gamma_range())
print()
print(level2.fp16_underflow())
