"""Tokenizers under Megatron Core's newer entry point (`megatron.core.tokenizers`).

Mirrors `megatron.core.tokenizers`: only `MegatronTokenizer.from_pretrained` for the null
tokenizer library (what Megatron's example scripts and mock-data tutorials use). Real text
tokenizers live in `gigatron.training.tokenizer` (`build_tokenizer`).
"""

from gigatron.core.tokenizers.megatron_tokenizer import MegatronTokenizer

__all__ = ["MegatronTokenizer"]
