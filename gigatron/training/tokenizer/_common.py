"""Pieces the tokenizer classes share (part of `megatron.training.tokenizer.tokenizer`'s classes).

`_import_tokenizers()` returns Hugging Face `tokenizers` or says which package to install.

Megatron's `_NullTokenizer` and `_GPTSentencePieceTokenizer` (hence `_Llama2Tokenizer`) have no
BERT special tokens: `cls`, `sep` and `mask` are -1 and `additional_special_tokens_ids` is None.
"""

from __future__ import annotations

import json

from gigatron.core.tokenizers.null_tokenizer import WithoutBertSpecials
from gigatron.core.untrusted_files import UntrustedFileError, read_text

_WithoutBertSpecials = WithoutBertSpecials  # the mixin lives in core (NullTokenizer uses it)


def read_tokenizer_text(path: str, what: str) -> str:
    """A tokenizer file from elsewhere: a regular UTF-8 file within `LIMITS["tokenizer"]`
    (bad UTF-8, a FIFO or a directory is one line naming the file)."""
    return read_text(path, what=what, max_bytes="tokenizer")


def read_json_file(path: str, what: str, kind: type = dict):
    """The JSON value of a tokenizer file, which must be a `kind` (one line otherwise)."""
    try:
        value = json.loads(read_tokenizer_text(path, what))
    except json.JSONDecodeError as e:
        raise UntrustedFileError(
            f"{what} {path} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(value, kind):
        raise UntrustedFileError(
            f"{what} {path} holds a {type(value).__name__}, not a JSON "
            f"{'object' if kind is dict else 'list'}"
        )
    return value


def read_merges(path: str) -> list[tuple[str, str]]:
    """merges.txt as the tokenizers library reads it: an optional `#version` line, then one
    merge `a b` (two tokens, one space) a line."""
    merges = []
    for line_no, line in enumerate(read_tokenizer_text(path, "BPE merges").split("\n"), 1):
        line = line.rstrip("\r")
        if not line or (line_no == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise UntrustedFileError(
                f"BPE merges {path} line {line_no} ({line[:80]!r}) is not two tokens "
                "separated by one space"
            )
        merges.append((parts[0], parts[1]))
    return merges


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError(
            "this tokenizer needs the Hugging Face `tokenizers` package: "
            "pip install 'gigatron[data]' (or pip install tokenizers)"
        ) from err
    return tokenizers
