"""KDA from zero to one: chunkwise linear-attention kernels in TileLang, level by level.

Public functions (``[B, T, H, D]`` tensors, like flash-linear-attention):

* ``linear_attention(q, k, v, ...)``         level 1, ``S <- S + k v^T``
* ``decay_attention(q, k, v, alpha, ...)``   level 2, ``S <- a S + k v^T``
* ``gated_attention(q, k, v, g, ...)``       level 3, ``S <- diag(exp g_t) S + k v^T``
* ``delta_rule(q, k, v, beta, ...)``         level 4, ``S <- S + b k (v - S^T k)^T``
* ``chunk_kda`` / ``chunk_gated_delta_rule``  level 5 (KDA, GDN), fla 0.6.0's API: packed sequences
  (``cu_seqlens``), grouped value heads, initial and final states

* ``fused_recurrent_kda`` / ``fused_recurrent_gated_delta_rule``  decode (a few tokens per sequence per
  step), fla-shaped, with a state pool for continuous batching

Context parallelism and the intra-card split of long sequences: ``kda.distributed``.

On CUDA tensors they run TileLang kernels (``pip install kda[gpu]``); on CPU tensors a
plain PyTorch chunked path. References live in ``kda.reference``.
"""

from kda.decode import fused_recurrent_gated_delta_rule, fused_recurrent_kda
from kda.delta import delta_rule
from kda.gated import gated_attention
from kda.gated_delta import chunk_gated_delta_rule, chunk_kda
from kda.ops import decay_attention, linear_attention
from kda import custom_ops  # noqa: E402,F401  (registers the kda:: ops for torch.compile)

__version__ = "0.1.0"
__all__ = ["linear_attention", "decay_attention", "gated_attention", "delta_rule", "chunk_kda",
           "chunk_gated_delta_rule", "fused_recurrent_kda", "fused_recurrent_gated_delta_rule", "__version__"]
