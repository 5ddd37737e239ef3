"""`MegatronTokenizerText` (mirrors `megatron.core.tokenizers.text.text_tokenizer`): a text
tokenizer over one library, configured by a metadata dict. gigatron's libraries: "null" (also
spelled "null-text") and "byte-level"; any other raises ValueError naming `build_tokenizer`,
which builds the real text tokenizers (`gigatron.training.tokenizer`).
"""

from __future__ import annotations

from collections import OrderedDict

from gigatron.core.tokenizers.text.libraries.bytelevel_tokenizer import ByteLevelTokenizer
from gigatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

_NULL = ("null", "null-text")
_LIBRARIES = (*_NULL, "byte-level")


class MegatronTokenizerText:
    """`MegatronTokenizerText(path, config, vocab_size=N)`: tokenize / detokenize and the
    special ids through the library named by `config["library"]`."""

    def __init__(self, path: str | None, config: dict, **kwargs) -> None:
        library = config.get("library")
        if library not in _LIBRARIES:
            raise ValueError(
                f"tokenizer library ({library!r}) is not supported by gigatron's "
                f"MegatronTokenizerText (only {_LIBRARIES}); build text tokenizers with "
                "gigatron.training.tokenizer.build_tokenizer"
            )
        self.path, self.config = path, config
        self.library = library
        if library == "byte-level":
            self._tokenizer = ByteLevelTokenizer(**kwargs)
            return
        if "vocab_size" not in kwargs:
            raise ValueError("the null text tokenizer needs vocab_size=N")
        self._tokenizer = NullTokenizer(**kwargs)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.text_to_ids(text)

    def detokenize(self, ids: list[int], skip_special_tokens: bool | None = None) -> str:
        return self._tokenizer.ids_to_text(ids)

    def offsets(self, ids: list[int], text: str) -> list[int]:
        return self._tokenizer.offsets(ids, text)

    @property
    def unique_identifiers(self) -> OrderedDict:
        return self._tokenizer.unique_identifiers

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    @property
    def eod(self) -> int:
        return self._tokenizer.eod

    @property
    def pad(self) -> int:
        return self._tokenizer.pad_id

    pad_id = pad

    @property
    def additional_special_tokens_ids(self):
        return self._tokenizer.additional_special_tokens_ids
