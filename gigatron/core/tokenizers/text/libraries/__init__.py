"""Text tokenizer libraries (mirrors `megatron.core.tokenizers.text.libraries`): gigatron has
the null and byte-level libraries; Hugging Face, SentencePiece and tiktoken text tokenizers are
built by `gigatron.training.tokenizer.build_tokenizer`."""

from gigatron.core.tokenizers.text.libraries.bytelevel_tokenizer import ByteLevelTokenizer
from gigatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

__all__ = ["ByteLevelTokenizer", "NullTokenizer"]
