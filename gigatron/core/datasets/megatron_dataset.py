"""Base class of the mid-level datasets (GPTDataset, ...): identity, cache hash, pad id.

Mirrors `megatron.core.datasets.megatron_dataset`. The JSON of `unique_identifiers` (indent 4)
and its md5 are built exactly as Megatron builds them; the md5 names the index cache files.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

import numpy
import torch

from gigatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from gigatron.core.datasets.utils import Split

LowLevelDataset = Any
_PAD_TOKEN_ID = -1


def _special_token_ids(tokenizer: Any) -> list[int]:
    try:
        return [v for k, v in tokenizer.special_tokens_dict.items() if k != "pad_token"]
    except (AttributeError, IndexError, ValueError):
        pass
    ids = []
    for name in ("eos", "eod"):
        try:
            ids.append(getattr(tokenizer, name))
        except (AttributeError, NotImplementedError):
            pass
    return ids


class MegatronDataset(ABC, torch.utils.data.Dataset):
    """A dataset over `indices` of a low-level dataset, for one split.

    Args:
        dataset: the low-level dataset (an IndexedDataset or a mock).
        dataset_path: its path prefix (bookkeeping and cache naming), or None.
        indices: int32 `[n]` the low-level elements this split exposes.
        num_samples: minimum samples to build; None = one epoch.
        index_split: which Split this is.
        config: the dataset config.
    """

    def __init__(
        self,
        dataset: LowLevelDataset,
        dataset_path: str | None,
        indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        self.dataset = dataset
        self.dataset_path = dataset_path
        self.indices = indices
        self.num_samples = num_samples
        self.index_split = index_split
        self.config = config

        self.unique_identifiers = OrderedDict()
        self.unique_identifiers["class"] = type(self).__name__
        self.unique_identifiers["dataset_path"] = self.dataset_path
        self.unique_identifiers["num_samples"] = self.num_samples
        self.unique_identifiers["index_split"] = self.index_split.name
        for attr in self._key_config_attributes():
            self.unique_identifiers[attr] = getattr(self.config, attr)
        self.unique_description = json.dumps(
            self.unique_identifiers, indent=4, default=lambda obj: obj.unique_identifiers
        )
        self.unique_description_hash = hashlib.md5(
            self.unique_description.encode("utf-8"), usedforsecurity=False
        ).hexdigest()

        try:
            self._pad_token_id = self.config.tokenizer.pad
        except Exception:
            self._pad_token_id = _PAD_TOKEN_ID
        if self._pad_token_id is None:  # e.g. a Hugging Face tokenizer without a pad token
            self._pad_token_id = _PAD_TOKEN_ID
        if self._pad_token_id in _special_token_ids(self.config.tokenizer):
            if self.config.allow_ambiguous_pad_tokens:
                warnings.warn(
                    "the tokenizer's pad id collides with another special token id; pad tokens "
                    "already in the data will be loss-masked (allow_ambiguous_pad_tokens=True)",
                    stacklevel=2,
                )
            else:
                self._pad_token_id = _PAD_TOKEN_ID
                warnings.warn(
                    "the tokenizer's pad id collides with another special token id; using -1 "
                    "as the pad id so no real token is masked out",
                    stacklevel=2,
                )

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: LowLevelDataset) -> int:
        """Number of elements the split fractions apply to."""
        raise NotImplementedError

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: BlendedMegatronDatasetConfig) -> Any:
        raise NotImplementedError

    @staticmethod
    def _key_config_attributes() -> list[str]:
        """Config attributes that, with class/path/size/split, identify the built indices."""
        return ["random_seed", "sequence_length", "split", "split_matrix", "tokenizer"]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, idx: int) -> dict[str, Any]: ...
