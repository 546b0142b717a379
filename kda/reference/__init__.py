"""Float64 PyTorch references, one module per level (CPU or GPU tensors)."""

from kda.reference import level1, level2

__all__ = ["level1", "level2"]
