"""`MegatronTokenizer.from_pretrained` for metadata-only (null) tokenizers.

Mirrors `megatron.core.tokenizers.megatron_tokenizer.MegatronTokenizer`. Megatron reads a
metadata dict (or a metadata.json path) naming a tokenizer library; gigatron supports the null
library, which needs no files: `{"library": "null-text"}` (Megatron 0.20's text library) gives a
`MegatronTokenizerText` whose `vocab_size` is the argument, EOD its last id and pad -1;
gigatron's `{"library": "null"}` gives the legacy `NullTokenizer` (EOD the extra id `vocab_size`,
so its `vocab_size` is the argument + 1). The byte-level library (`{"library": "byte-level"}`,
`gigatron.core.tokenizers.text.libraries.ByteLevelTokenizer`) gives a `MegatronTokenizerText`
over UTF-8 bytes, its kwargs passed on. Other libraries raise a ValueError pointing at
`gigatron.training.tokenizer.build_tokenizer`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gigatron.core.tokenizers.null_tokenizer import NullTokenizer
from gigatron.core.untrusted_files import read_text

_NULL_LIBRARIES = ("null", "null-text")
_LIBRARIES = (*_NULL_LIBRARIES, "byte-level")


class MegatronTokenizer:
    """Factory; `from_pretrained` returns a tokenizer object (never an instance of this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "MegatronTokenizer is a factory: call MegatronTokenizer.from_pretrained("
            "metadata_path={'library': 'null'}, vocab_size=N)"
        )

    @staticmethod
    def from_pretrained(
        tokenizer_path: str | None = None,
        metadata_path: str | dict | None = None,
        **kwargs: Any,
    ) -> NullTokenizer | Any:
        """Build the tokenizer described by `metadata_path` (a dict or a metadata.json path).

        Args:
            tokenizer_path: unused by the null library (Megatron's folder holding metadata.json).
            metadata_path: `{"library": "null"}` / `{"library": "null-text"}` or a json file.
            **kwargs: `vocab_size` (required for the null library).
        Returns:
            for "null-text" (and "byte-level") a `MegatronTokenizerText`; for "null" a
            `NullTokenizer` with `vocab_size == kwargs["vocab_size"] + 1` and `eod` the last id.
        """
        if metadata_path is None and tokenizer_path is not None:
            metadata_path = os.path.join(tokenizer_path, "metadata.json")
        if isinstance(metadata_path, str):
            text = read_text(metadata_path, what="tokenizer metadata", max_bytes="json_small")
            try:
                metadata = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"tokenizer metadata {metadata_path} is not JSON ({e})") from None
            if not isinstance(metadata, dict):
                raise ValueError(f"tokenizer metadata {metadata_path} is not a JSON object")
        elif isinstance(metadata_path, dict):
            metadata = metadata_path
        else:
            raise ValueError(
                f"metadata_path ({metadata_path!r}) must be a dict or a path to metadata.json"
            )
        library = metadata.get("library")
        if library in ("byte-level", "null-text"):  # no files: the library's kwargs configure it
            from gigatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText

            return MegatronTokenizerText(tokenizer_path, metadata, **kwargs)
        if library not in _NULL_LIBRARIES:
            raise ValueError(
                f"tokenizer library ({library!r}) is not supported by gigatron's "
                f"MegatronTokenizer.from_pretrained (only {_LIBRARIES}); build text "
                "tokenizers with gigatron.training.tokenizer.build_tokenizer"
            )
        if "vocab_size" not in kwargs:
            raise ValueError("the null tokenizer needs vocab_size=N (ids 0..N-1, EOD is id N)")
        return NullTokenizer(int(kwargs["vocab_size"]))
