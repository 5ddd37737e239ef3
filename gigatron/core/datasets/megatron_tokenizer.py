"""Abstract tokenizer interface the datasets and training code rely on.

Mirrors `megatron.core.datasets.megatron_tokenizer.MegatronLegacyTokenizer` (Megatron's
`megatron.training.tokenizer` classes derive from it). `unique_identifiers` feeds the md5 that
names dataset cache files, so it is built exactly as Megatron builds it: the class name, the
tokenizer paths and every keyword option as a string.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any


class MegatronLegacyTokenizer(ABC):
    """Base class: `tokenize`, `detokenize`, `vocab_size` and the special-token ids.

    Args:
        *tokenizer_paths: every file or prefix the tokenizer was loaded from.
        **tokenizer_options: every option that changes the token ids.
    """

    def __init__(self, *tokenizer_paths: str, **tokenizer_options: Any) -> None:
        self.unique_identifiers: OrderedDict = OrderedDict()
        self.unique_identifiers["class"] = type(self).__name__
        self.unique_identifiers["tokenizer_path"] = list(tokenizer_paths)
        for option in tokenizer_options:
            self.unique_identifiers[option] = str(tokenizer_options[option])
        self.unique_description = json.dumps(self.unique_identifiers, indent=4)
        super().__init__()

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Text -> token ids."""

    def detokenize(self, ids: list[int]) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no method 'detokenize'")

    def offsets(self, ids: list[int], text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} has no method 'offsets'")

    @property
    @abstractmethod
    def vocab(self) -> dict:
        """Token text -> id."""

    @property
    @abstractmethod
    def inv_vocab(self) -> dict:
        """Id -> token text."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids (before padding for tensor parallelism)."""

    def _missing(self, name: str):
        raise NotImplementedError(f"{type(self).__name__} has no attribute '{name}'")

    @property
    def cls(self) -> int:
        return self._missing("cls")

    @property
    def sep(self) -> int:
        return self._missing("sep")

    @property
    def pad(self) -> int:
        return self._missing("pad")

    @property
    def eod(self) -> int:
        return self._missing("eod")

    @property
    def bos(self) -> int:
        return self._missing("bos")

    @property
    def eos(self) -> int:
        return self._missing("eos")

    @property
    def mask(self) -> int:
        return self._missing("mask")


MegatronTokenizer = MegatronLegacyTokenizer
