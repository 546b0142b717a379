"""Float64 PyTorch references, one module per level (CPU or GPU tensors):
``kda.reference.level1``, ``kda.reference.level2``. Import the level you need."""
