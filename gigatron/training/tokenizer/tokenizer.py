"""Tokenizers with Megatron's interface, and `build_tokenizer(args)`.

Mirrors `megatron.training.tokenizer.tokenizer`.
"""

from __future__ import annotations

from gigatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer


class _NullTokenizer(MegatronLegacyTokenizer):
    """Ids written as space-separated integers; EOD is the extra id `vocab_size` (so the
    tokenizer's `vocab_size` is the argument + 1, and `eod == vocab_size - 1`)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(None, vocab_size=vocab_size)
        self._vocab_size_without_eod = int(vocab_size)
        self._eod_id = self._vocab_size_without_eod

    def tokenize(self, text: str) -> list[int]:
        return [int(x) for x in text.split(" ")]

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(str(x) for x in ids)

    def offsets(self, ids: list[int], text: str) -> list[int]:
        offsets, start = [], 0
        for id_ in ids:
            offsets.append(start)
            start += 1 + len(str(id_))
        return offsets

    @property
    def vocab_size(self) -> int:
        return self._vocab_size_without_eod + 1

    @property
    def vocab(self) -> dict:
        raise NotImplementedError("_NullTokenizer has no vocab")

    @property
    def inv_vocab(self) -> dict:
        raise NotImplementedError("_NullTokenizer has no inv_vocab")

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
    def eod(self) -> int:
        return self._eod_id

    @property
    def eos(self) -> int:
        return self._eod_id

    @property
    def additional_special_tokens_ids(self) -> None:
        return None
