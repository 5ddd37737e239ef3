"""Text tokenizers (mirrors `megatron.core.tokenizers.text`)."""

from gigatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText

__all__ = ["MegatronTokenizerText"]
