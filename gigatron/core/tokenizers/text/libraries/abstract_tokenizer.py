"""`MegatronTokenizerTextAbstract`: what a text tokenizer library implements (text <-> tokens
<-> ids, special tokens). `cls_id`, `sep_id`, `pad_id`, `bos_id`, `eos_id`, `mask_id` return the
library's short attribute (`cls`, ...) and raise AttributeError without one; `eod` is `eod_id`,
else `eos_id`."""

from __future__ import annotations

from abc import ABC, abstractmethod


class MegatronTokenizerTextAbstract(ABC):
    """A text tokenizer library of `MegatronTokenizerText`."""

    @abstractmethod
    def text_to_tokens(self, text: str) -> list: ...

    @abstractmethod
    def tokens_to_text(self, tokens: list) -> str: ...

    @abstractmethod
    def tokens_to_ids(self, tokens: list) -> list[int]: ...

    @abstractmethod
    def ids_to_tokens(self, ids: list[int]) -> list: ...

    @abstractmethod
    def text_to_ids(self, text: str) -> list[int]: ...

    @abstractmethod
    def ids_to_text(self, ids: list[int]) -> str: ...

    @abstractmethod
    def add_special_tokens(self, special_tokens): ...

    def _short(self, name: str) -> int:
        """The library's own attribute `name` (cls, sep, pad, ...): the `<name>_id` aliases."""
        try:
            return object.__getattribute__(self, name)
        except AttributeError:
            pass
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}' or '{name}_id'")

    @property
    def cls_id(self) -> int:
        return self._short("cls")

    @property
    def sep_id(self) -> int:
        return self._short("sep")

    @property
    def pad_id(self) -> int:
        return self._short("pad")

    @property
    def eod(self) -> int:
        """`eod_id`, else `eos_id` (a library without an end-of-document token)."""
        for name in ("eod_id", "eos_id"):
            try:
                return getattr(self, name)
            except AttributeError:
                continue
        raise AttributeError(f"{type(self).__name__} has no attribute 'eod', 'eod_id', 'eos', "
                             "or 'eos_id'")  # fmt: skip

    @property
    def bos_id(self) -> int:
        return self._short("bos")

    @property
    def eos_id(self) -> int:
        return self._short("eos")

    @property
    def mask_id(self) -> int:
        return self._short("mask")
