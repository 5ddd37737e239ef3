"""A weighted mixture of mid-level datasets (one per corpus) for one split.

Mirrors `megatron.core.datasets.blended_dataset`. Sample i comes from dataset
`dataset_index[i]`, its `dataset_sample_index[i]`-th sample; both arrays come from the greedy
builders in `helpers` and are cached (only with `path_to_cache`) under md5-named files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from typing import Any

import numpy
import torch

from gigatron.core.datasets import helpers
from gigatron.core.datasets._index_cache import (
    cache_description,
    check,
    description_matches,
    load_index,
    out_of_range,
    save_cache,
)
from gigatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from gigatron.core.datasets.megatron_dataset import MegatronDataset
from gigatron.core.datasets.utils import log_single_rank, normalize

logger = logging.getLogger(__name__)


class BlendedDataset(torch.utils.data.Dataset):
    """Blend `datasets` by `weights`.

    Args:
        datasets: mid-level datasets of the same class and split.
        weights: positive weights; with `size` None they are exact integer sample counts.
        size: number of samples to draw; None = exhaustive (sum of integer weights).
        config: the dataset config.
    """

    def __init__(
        self,
        datasets: list[MegatronDataset],
        weights: list[int | float],
        size: int | None,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        if not 0 < len(datasets) < 32767:
            raise ValueError(f"number of datasets ({len(datasets)}) must be in [1, 32767)")
        if any(type(d) is not type(datasets[0]) for d in datasets):
            raise ValueError("all blended datasets must be of the same class")
        if any(d.index_split != datasets[0].index_split for d in datasets):
            raise ValueError("all blended datasets must belong to the same split")
        if not all(w > 0 for w in weights):
            raise ValueError(
                f"blend weights {list(weights)} must all be positive (a dataset of the "
                f"{datasets[0].index_split.name} split may be empty)"
            )
        if size is None and any(w != int(w) for w in weights):
            raise ValueError(
                f"exhaustive blending (size None) needs integer weights, got {weights}"
            )
        if size is not None:
            weights = normalize(weights)

        self.datasets = datasets
        self.split = datasets[0].index_split
        self.weights = weights
        self.size = size
        self.config = config

        unique_identifiers = OrderedDict()
        unique_identifiers["class"] = type(self).__name__
        unique_identifiers["datasets"] = [d.unique_identifiers for d in datasets]
        unique_identifiers["split"] = self.split.name
        unique_identifiers["weights"] = self.weights
        unique_identifiers["size"] = self.size
        self.unique_description = json.dumps(
            unique_identifiers, indent=4, default=lambda obj: obj.unique_identifiers
        )
        self.unique_description_hash = hashlib.md5(
            self.unique_description.encode("utf-8"), usedforsecurity=False
        ).hexdigest()
        self.dataset_index, self.dataset_sample_index = self._build_indices()

    def __len__(self) -> int:
        return self.dataset_index.shape[0]

    def __getitem__(self, idx: int) -> dict[str, Any]:
        dataset_id = self.dataset_index[idx]
        sample_id = self.dataset_sample_index[idx]
        return {"dataset_id": dataset_id, **self.datasets[dataset_id][sample_id]}

    def _build_indices(self) -> tuple[numpy.ndarray, numpy.ndarray]:
        """int16 `[size]` dataset ids and int64 `[size]` per-dataset sample ids."""
        path_to_cache = self.config.path_to_cache
        paths = {}
        if path_to_cache:
            base = f"{self.unique_description_hash}-{type(self).__name__}-{self.split.name}"
            for affix in ("description.txt", "dataset_index.npy", "dataset_sample_index.npy"):
                paths[affix] = os.path.join(path_to_cache, f"{base}-{affix}")
        cache_hit = bool(paths) and all(os.path.isfile(p) for p in paths.values())
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        writer = not dist_on or torch.distributed.get_rank() == 0
        if path_to_cache and (cache_hit or not writer):
            log_single_rank(logger, logging.INFO, f"Load the {type(self).__name__} indices")
            cached = self._load_cached_indices(paths)
            if cached is not None:
                return cached

        n = len(self.datasets)
        if self.size is not None:
            dataset_index = numpy.zeros(self.size, dtype=numpy.int16)
            dataset_sample_index = numpy.zeros(self.size, dtype=numpy.int64)
            helpers.build_blending_indices(
                dataset_index, dataset_sample_index, self.weights, n, self.size, False
            )
        else:
            total = int(sum(self.weights))
            dataset_index = numpy.zeros(total, dtype=numpy.int16)
            dataset_sample_index = numpy.zeros(total, dtype=numpy.int64)
            helpers.build_exhaustive_blending_indices(
                dataset_index, dataset_sample_index, [int(w) for w in self.weights], n
            )
        ids, counts = numpy.unique(dataset_index, return_counts=True)
        for k, count in zip(ids, counts):
            if len(self.datasets[k]) < count:
                raise IndexError(
                    f"the {self.split.name} blend oversamples its datasets: it requests {count} "
                    f"samples from {type(self.datasets[k]).__name__} number {k} "
                    f"({self.datasets[k].dataset_path}) which has {len(self.datasets[k])}; raise "
                    f"mid_level_dataset_surplus (now {self.config.mid_level_dataset_surplus})"
                )
        if path_to_cache and writer:
            os.makedirs(path_to_cache, exist_ok=True)
            save_cache(
                paths["description.txt"],
                self._cache_description(),
                {
                    paths["dataset_index.npy"]: dataset_index,
                    paths["dataset_sample_index.npy"]: dataset_sample_index,
                },
            )
        return dataset_index, dataset_sample_index

    def _cache_description(self) -> str:
        """description.txt: Megatron's description and every corpus file's fingerprint."""
        fingerprints = [getattr(d.dataset, "fingerprint", None) for d in self.datasets]
        return cache_description(self.unique_description, fingerprints)

    def _load_cached_indices(self, paths: dict[str, str]) -> tuple | None:
        """The two cached indices, or None (stale, warned): a dataset id out of range, a sample
        id past its dataset's length, or another length than this blend draws is rebuilt."""
        if not description_matches(paths["description.txt"], self._cache_description()):
            return None
        dataset_index = load_index(paths["dataset_index.npy"], ndim=1)
        sample_index = load_index(paths["dataset_sample_index.npy"], ndim=1)
        if dataset_index is None or sample_index is None:
            return None
        size = self.size if self.size is not None else int(sum(self.weights))
        problem = None
        if dataset_index.shape != (size,):
            problem = f"{dataset_index.shape[0]} entries, the blend draws {size}"
        problem = problem or out_of_range(dataset_index, 0, len(self.datasets), "it")
        if not check(paths["dataset_index.npy"], problem):
            return None
        lengths = numpy.array([len(d) for d in self.datasets], dtype=numpy.int64)
        problem = None
        if sample_index.shape != (size,):
            problem = f"{sample_index.shape[0]} entries, the blend draws {size}"
        elif size and ((sample_index < 0) | (sample_index >= lengths[dataset_index])).any():
            problem = "a sample id lies past the end of its dataset"
        if not check(paths["dataset_sample_index.npy"], problem):
            return None
        return dataset_index, sample_index
