# snippet: cpu
"""State-update GEMMs with the sequence in the grid and in a loop (article 000 section 6.4.2),
and what a split design stores between its two kernels (section 6.4.3)."""
from kda.tables import level1

print(level1.sequence_out_of_grid(D=64, C=64, Ns=(8192, 16384, 32768, 65536)))
print()
print(level1.fused_or_split(B=1, T=32768, H=32, D=128, C=64))
