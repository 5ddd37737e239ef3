"""gigatron: the Megatron Core API for training large transformer models, in pure Python.

`gigatron.core` mirrors `megatron.core` (same module paths, names and semantics) and
`gigatron.training` mirrors the parts of `megatron.training` that users script against.
"""

__version__ = "0.1.0"
