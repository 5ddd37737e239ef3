"""Megatron's tokenizers (`megatron.training.tokenizer`)."""

from gigatron.training.tokenizer.tokenizer import _NullTokenizer

__all__ = ["_NullTokenizer"]
