"""The text null tokenizer of `megatron.core.tokenizers.text.libraries.null_tokenizer`.

Ids are the integers written in the text ("3 1 4" <-> [3, 1, 4]); EOD is `vocab_size - 1` unless
given, and there is no pad token (-1) unless given. Unlike `gigatron.core.tokenizers`'
`NullTokenizer` (the legacy one, whose EOD is the extra id `vocab_size`), `vocab_size` is the
embedding size as passed.
"""

from __future__ import annotations

from collections import OrderedDict

from gigatron.core.tokenizers.null_tokenizer import WithoutBertSpecials, space_separated_offsets


class NullTokenizer(WithoutBertSpecials):
    """Synthetic tokenizer for benchmarks and tests (Megatron's text-library NullTokenizer)."""

    def __init__(self, vocab_size: int, eod_id: int | None = None, pad_id: int = -1, **unused):
        self._vocab_size = int(vocab_size)
        self._eod_id = int(eod_id) if eod_id is not None else self._vocab_size - 1
        self._pad_id = int(pad_id)

    def text_to_ids(self, text: str) -> list[int]:
        return [int(x) for x in text.split(" ")]

    def ids_to_text(self, ids) -> str:
        return " ".join(str(x) for x in ids)

    def tokens_to_ids(self, tokens) -> list[int]:
        return [int(x) for x in tokens]

    def ids_to_tokens(self, ids) -> list[str]:
        return [str(x) for x in ids]

    def offsets(self, ids: list[int], text: str) -> list[int]:
        """Character offset of each id in `ids_to_text(ids)`."""
        return space_separated_offsets(ids)

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict(
            {
                "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "vocab_size": self._vocab_size,
                "eod_id": self._eod_id,
                "pad_id": self._pad_id,
            }
        )

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def vocab(self):
        raise NotImplementedError("the null tokenizer has no vocabulary")

    @property
    def inv_vocab(self):
        raise NotImplementedError("the null tokenizer has no vocabulary")

    @property
    def eod(self) -> int:
        return self._eod_id

    @property
    def pad_id(self) -> int:
        return self._pad_id
