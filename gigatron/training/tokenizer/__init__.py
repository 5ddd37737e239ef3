"""Megatron's tokenizers (`megatron.training.tokenizer`): `build_tokenizer(args)` and classes."""

from gigatron.training.tokenizer.tokenizer import (
    _BertWordPieceTokenizer,
    _GPT2BPETokenizer,
    _GPTSentencePieceTokenizer,
    _HuggingFaceTokenizer,
    _Llama2Tokenizer,
    _NullTokenizer,
    _SentencePieceTokenizer,
    _vocab_size_with_padding,
    build_tokenizer,
)

__all__ = [
    "build_tokenizer",
    "_vocab_size_with_padding",
    "_NullTokenizer",
    "_GPT2BPETokenizer",
    "_HuggingFaceTokenizer",
    "_SentencePieceTokenizer",
    "_GPTSentencePieceTokenizer",
    "_Llama2Tokenizer",
    "_BertWordPieceTokenizer",
]
