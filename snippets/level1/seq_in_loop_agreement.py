# snippet: cpu
"""Reference D for three stripe widths, and with the state update moved before the write-back."""
from kda.tables import level1

print(level1.seq_in_loop_agreement(seed=0, B=2, T=256, H=3, DK=64, DV=128, chunk_size=64))
