"""Text tokenizer libraries (mirrors `megatron.core.tokenizers.text.libraries`): gigatron has
the null library; Hugging Face, SentencePiece, tiktoken and byte-level text tokenizers are built
by `gigatron.training.tokenizer.build_tokenizer`."""

from gigatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

__all__ = ["NullTokenizer"]
