"""Pieces the tokenizer classes share (part of `megatron.training.tokenizer.tokenizer`'s classes).

`_import_tokenizers()` returns Hugging Face `tokenizers` or says which package to install.

Megatron's `_NullTokenizer` and `_GPTSentencePieceTokenizer` (hence `_Llama2Tokenizer`) have no
BERT special tokens: `cls`, `sep` and `mask` are -1 and `additional_special_tokens_ids` is None.
"""

from __future__ import annotations


class _WithoutBertSpecials:
    """Mixin (list it before the tokenizer base class): no <CLS>/<SEP>/<MASK>, no sentinels."""

    @property
    def cls(self) -> int:
        return -1

    @property
    def sep(self) -> int:
        return -1

    @property
    def mask(self) -> int:
        return -1

    @property
    def additional_special_tokens_ids(self) -> None:
        return None


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError(
            "this tokenizer needs the Hugging Face `tokenizers` package: "
            "pip install 'gigatron[data]' (or pip install tokenizers)"
        ) from err
    return tokenizers
