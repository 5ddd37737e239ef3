"""Mirrors `megatron.core.enums`: `ModelType`, the enum `pretrain(...)` takes.

megatron-core has it here and (as a second copy) in `megatron.core.transformer.enums`; gigatron
has one class, so both import paths give the same object and compare equal.
"""

from gigatron.core.transformer.enums import ModelType

__all__ = ["ModelType"]
