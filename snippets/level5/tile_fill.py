# snippet: cpu
"""Short packed sequences in tiles of 64 rows: the tiles filled in order against the tiles packed by best fit (the
longest sequences first, each into the fullest tile it still fits), and the chunks of the same tokens as one
sequence. Run 140's two cases: 1024 sequences of 1 to 64 tokens, 8192 of 1 to 8."""
from kda.tables import level5

print(level5.tile_fill())
