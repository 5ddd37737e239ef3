"""Pieces the tokenizer classes share (part of `megatron.training.tokenizer.tokenizer`'s classes).

`_import_tokenizers()` returns Hugging Face `tokenizers` or says which package to install.

Megatron's `_NullTokenizer` and `_GPTSentencePieceTokenizer` (hence `_Llama2Tokenizer`) have no
BERT special tokens: `cls`, `sep` and `mask` are -1 and `additional_special_tokens_ids` is None.
"""

from __future__ import annotations

from gigatron.core.tokenizers.null_tokenizer import WithoutBertSpecials

_WithoutBertSpecials = WithoutBertSpecials  # the mixin lives in core (NullTokenizer uses it)


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError(
            "this tokenizer needs the Hugging Face `tokenizers` package: "
            "pip install 'gigatron[data]' (or pip install tokenizers)"
        ) from err
    return tokenizers
