"""Configuration shared by all Megatron-style datasets: blends, splits, caching.

Mirrors `megatron.core.datasets.blended_megatron_dataset_config`. The split string "99,1,0" is
normalised to fractions and turned into a split matrix of (begin, end) book-ends, exactly as
Megatron does, so split boundaries (and hence cache file names) agree.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from gigatron.core.datasets.utils import Split, log_single_rank, normalize

logger = logging.getLogger(__name__)

Blend = tuple[list[str], list[float] | None]


def _check_blend(name: str, blend: Any) -> None:
    prefixes, weights = blend
    if weights is None:
        return
    if len(prefixes) != len(weights):
        raise ValueError(
            f"{name}: {len(prefixes)} prefixes but {len(weights)} weights; they must be equal "
            "in number"
        )
    try:
        normalize(weights)  # raises on non-finite or negative weights, or a non-positive sum
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


@dataclass
class BlendedMegatronDatasetConfig:
    """Configuration object for Megatron Core datasets."""

    random_seed: int
    """The seed for all RNG during dataset creation."""

    sequence_length: int
    """The sequence length (tokens per sample)."""

    blend: Blend | None = None
    """(prefixes, weights or None); None weights = proportional to dataset sizes."""

    blend_per_split: list[Blend | None] | None = None
    """One blend per split (train, valid, test); excludes `blend` and `split`."""

    multiple_validation_sets: bool | None = None
    """Treat the validation blend as separate datasets."""

    full_validation: bool | None = None
    """Run a full validation epoch each time."""

    split: str | None = None
    """Comma-separated split weights, e.g. "99,1,0"; needed with `blend`."""

    split_matrix: list[tuple[float, float] | None] | None = field(init=False, default=None)
    """(begin, end) fraction of the low-level dataset per split; derived from `split`."""

    num_dataset_builder_threads: int = 1
    """Threads for building datasets (gigatron builds serially; kept for compatibility)."""

    path_to_cache: str | None = None
    """Where index caches go; default `<prefix>/cache/GPTDataset_indices`."""

    mmap_bin_files: bool = True
    """Memory-map the .bin files (else read with file pointers)."""

    mock: bool = field(init=False, default=False)
    """Derived: True when neither blend nor blend_per_split is given."""

    tokenizer: Any = None
    """A MegatronLegacyTokenizer-like object (vocab_size, eod, pad, unique_identifiers)."""

    mid_level_dataset_surplus: float = 0.005
    """Extra fraction of samples built per component dataset of a weighted blend."""

    allow_ambiguous_pad_tokens: bool | None = False
    """Keep the tokenizer's pad id even when it collides with another special token."""

    fast_cache_load: bool = False
    """Not supported by gigatron (must stay False)."""

    defer_npy_index_mmap: bool = False
    """Not supported by gigatron (must stay False)."""

    def __post_init__(self) -> None:
        if self.fast_cache_load or self.defer_npy_index_mmap:
            raise ValueError(
                f"fast_cache_load ({self.fast_cache_load}) and defer_npy_index_mmap "
                f"({self.defer_npy_index_mmap}) are not supported by gigatron; leave them False"
            )
        if self.sequence_length is None or self.sequence_length < 1:
            raise ValueError(f"sequence_length ({self.sequence_length}) must be >= 1")
        if self.blend_per_split is not None and any(self.blend_per_split):
            if self.blend is not None:
                raise ValueError("blend and blend_per_split are incompatible; give one")
            if self.split is not None:
                raise ValueError("split and blend_per_split are incompatible; give one")
            if len(self.blend_per_split) != len(Split):
                raise ValueError(
                    f"blend_per_split has {len(self.blend_per_split)} entries, must have "
                    f"{len(Split)} (train, valid, test)"
                )
            for s in Split:
                if self.blend_per_split[s.value] is not None:
                    _check_blend(f"blend_per_split[{s.name}]", self.blend_per_split[s.value])
            return
        if self.blend is not None:
            _check_blend("blend", self.blend)
            if self.split is None:
                raise ValueError("split must be provided when blend is given (e.g. '99,1,0')")
        else:
            self.mock = True
            self.split = "1,1,1"
            log_single_rank(logger, logging.INFO, "No blend given: mock data, split = 1,1,1")
        self.split_matrix = convert_split_vector_to_split_matrix(
            parse_and_normalize_split(self.split)
        )


def parse_and_normalize_split(split: str) -> list[float]:
    """ "99,1,0" -> [0.99, 0.01, 0.0] (missing entries are 0)."""
    values = list(map(float, re.findall(r"[.0-9]+", split)))
    if len(values) > len(Split):
        raise ValueError(f"split {split!r} has {len(values)} entries; at most {len(Split)}")
    values += [0.0] * (len(Split) - len(values))
    if not sum(values) > 0:
        raise ValueError(f"split {split!r} must have a positive sum")
    return normalize(values)


def convert_split_vector_to_split_matrix(
    vector_a: list[float], vector_b: list[float] | None = None
) -> list[tuple[float, float] | None]:
    """[0.99, 0.01, 0.0] -> [(0, 0.99), (0.99, 1.0), None]; with `vector_b`, the overlaps."""
    if vector_b is None:
        vector_b = vector_a

    def bookends(vector: list[float]) -> list[tuple[float, float]]:
        expansion = functools.reduce(lambda acc, x: acc + [acc[-1] + x], vector, [0])
        return list(zip(expansion[:-1], expansion[1:]))

    matrix: list[tuple[float, float] | None] = []
    for a, b in zip(bookends(vector_a), bookends(vector_b)):
        if min(a[1], b[1]) <= max(a[0], b[0]):
            matrix.append(None)
        else:
            matrix.append((max(a[0], b[0]), min(a[1], b[1])))
    return matrix
