# snippet: cpu
"""What the chunk size buys the sequence-in-grid kernel, and what the score tile costs."""
from kda.tables import level1

print(level1.chunk_size_choice(D=64, Cs=(32, 64, 128, 256), threads=128))
