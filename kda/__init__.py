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

import importlib
from typing import TYPE_CHECKING

from kda import custom_ops  # noqa: F401  (registers the kda:: ops for torch.compile)

__version__ = "0.1.0"

# Each public function is imported from its level's module on first use (PEP 562): a program that
# runs level 1 loads neither level 5 nor decode, and a GPU record (which hashes the kda modules its
# run loaded, kda.site.snippets) goes stale only when code it ran changes.
_HOMES = {"linear_attention": "kda.ops", "decay_attention": "kda.ops", "gated_attention": "kda.gated",
          "delta_rule": "kda.delta", "chunk_kda": "kda.gated_delta", "chunk_gated_delta_rule": "kda.gated_delta",
          "fused_recurrent_kda": "kda.decode", "fused_recurrent_gated_delta_rule": "kda.decode"}
__all__ = [*_HOMES, "__version__"]


def __getattr__(name: str):
    if name not in _HOMES:                    # a submodule (kda.ops, ...), as when they were imported here
        try:
            return importlib.import_module(f"kda.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"kda.{name}":
                raise
            raise AttributeError(f"module 'kda' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value                   # found directly from now on
    return value


def __dir__():
    return sorted({*globals(), *_HOMES})


if TYPE_CHECKING:                             # for type checkers and editors
    from kda.decode import fused_recurrent_gated_delta_rule, fused_recurrent_kda  # noqa: F401
    from kda.delta import delta_rule  # noqa: F401
    from kda.gated import gated_attention  # noqa: F401
    from kda.gated_delta import chunk_gated_delta_rule, chunk_kda  # noqa: F401
    from kda.ops import decay_attention, linear_attention  # noqa: F401
