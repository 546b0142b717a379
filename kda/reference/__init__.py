"""Float64 PyTorch references, one module per level (CPU or GPU tensors): ``level0`` (the
lemmas, the WY form, the chunk as an affine map of the state, and the chunked forward of levels
4 and 5), ``level1`` to ``level5``. Each holds the token recurrence, the chunked form and, where a
kernel has one, the mirror of the kernel's order of operations. Import the level you need."""
