"""The null tokenizer: ids written as space-separated integers, no files.

Mirrors `megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer` (and Megatron's
`megatron.training.tokenizer.tokenizer._NullTokenizer`, which `gigatron.training.tokenizer`
derives from this class). EOD is the extra id `vocab_size`, so the tokenizer's `vocab_size` is
the argument + 1 and `eod == vocab_size - 1`, as in Megatron.
"""

from __future__ import annotations

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer

__all__ = ["NullTokenizer", "WithoutBertSpecials", "space_separated_offsets"]


def space_separated_offsets(ids: list[int]) -> list[int]:
    """Character offset of each id in `" ".join(str(i) for i in ids)`."""
    offsets, start = [], 0
    for id_ in ids:
        offsets.append(start)
        start += 1 + len(str(id_))
    return offsets


class WithoutBertSpecials:
    """Mixin (list it before the tokenizer base class): no <CLS>/<SEP>/<MASK>, no sentinels, as
    Megatron's null and GPT SentencePiece tokenizers."""

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


class NullTokenizer(WithoutBertSpecials, MegatronLegacyTokenizer):
    """Ids written as space-separated integers; EOD is the extra id `vocab_size` (so the
    tokenizer's `vocab_size` is the argument + 1, and `eod == vocab_size - 1`). No BERT special
    tokens: `cls`, `sep` and `mask` are -1 and `additional_special_tokens_ids` is None."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(None, vocab_size=vocab_size)
        self._vocab_size_without_eod = int(vocab_size)
        self._eod_id = self._vocab_size_without_eod

    def tokenize(self, text: str) -> list[int]:
        return [int(x) for x in text.split(" ")]

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(str(x) for x in ids)

    def offsets(self, ids: list[int], text: str) -> list[int]:
        return space_separated_offsets(ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size_without_eod + 1

    @property
    def vocab(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} has no vocab")

    @property
    def inv_vocab(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} has no inv_vocab")

    @property
    def eod(self) -> int:
        return self._eod_id

    @property
    def eos(self) -> int:
        return self._eod_id
