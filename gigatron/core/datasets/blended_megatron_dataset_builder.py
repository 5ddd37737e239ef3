"""Build the train / valid / test datasets from a config: splits, per-corpus sizes, blending.

Mirrors `megatron.core.datasets.blended_megatron_dataset_builder`. `build()` must run on every
rank: rank 0 builds (and caches) first, the others load after a barrier. Datasets are built one
after another (Megatron can use threads; the result is the same).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import numpy
import torch

from gigatron.compat.errors import ArgumentError
from gigatron.core.datasets.blended_dataset import BlendedDataset
from gigatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDataset, get_bin_path
from gigatron.core.datasets.megatron_dataset import MegatronDataset
from gigatron.core.datasets.utils import Split, normalize

MidLevelDataset = MegatronDataset
TopLevelDataset = BlendedDataset | MegatronDataset


def _dist_rank() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


class BlendedMegatronDatasetBuilder:
    """Builder of BlendedDataset and MegatronDataset splits.

    Args:
        cls: the mid-level dataset class (e.g. GPTDataset, MockGPTDataset).
        sizes: samples wanted per split [train, valid, test]; None = one epoch.
        is_built_on_rank: True where this rank needs the datasets.
        config: the dataset config.
    """

    def __init__(
        self,
        cls: type[MidLevelDataset],
        sizes: list[int | None],
        is_built_on_rank: Callable[[], bool],
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        self.cls = cls
        self.sizes = list(sizes)
        self.is_built_on_rank = is_built_on_rank
        self.config = config
        # (prefix, split index) of empty splits with 0 samples requested: None on every rank,
        # unlike a split not built on this rank (is_built_on_rank), which the blend still syncs
        self._unrequested_empty: set[tuple[str | None, int]] = set()
        if len(self.sizes) != len(Split):
            raise ValueError(f"sizes ({sizes}) must have {len(Split)} entries (train, valid, test)")
        if config.mock:
            return
        for split in Split:
            if config.blend_per_split is None:
                weights = config.blend[1]
            elif config.blend_per_split[split.value] is None:
                continue
            else:
                weights = config.blend_per_split[split.value][1]
            if self.sizes[split.value] is None and weights is not None:
                raise ArgumentError(
                    f"the {split.name} size is None (one epoch) but the blend has weights; "
                    "weights need a requested size"
                )

    def build(self) -> list[TopLevelDataset | None]:
        """[train, valid, test]; an entry is None when the split is empty or not on this rank."""
        datasets = self._build_blended_dataset_splits()
        for dataset in datasets:
            if isinstance(dataset, BlendedDataset) and len(dataset) > 0:
                assert dataset.size is None or dataset.size == len(dataset)
        return datasets

    def _build_blended_dataset_splits(self) -> list[Any]:
        if self.config.mock:
            return self._build_megatron_dataset_splits(None, self.config.split_matrix, self.sizes)
        if self.config.blend:
            prefixes, weights = self.config.blend
            return self._build_blends(prefixes, weights, self.config.split_matrix, self.sizes)
        datasets: list[Any] = [None] * len(Split)
        for i in range(len(Split)):
            blend = self.config.blend_per_split[i]
            if blend is None:
                continue
            split_spoof: list[Any] = [None] * len(Split)
            split_spoof[i] = (0.0, 1.0)
            sizes_spoof: list[Any] = [0] * len(Split)
            sizes_spoof[i] = self.sizes[i]
            prefixes, weights = blend
            if (
                self.config.multiple_validation_sets
                and i == Split.valid.value
                and len(prefixes) > 1
            ):
                datasets[i] = [
                    self._build_megatron_dataset_splits(p, split_spoof, sizes_spoof)[i]
                    for p in prefixes
                ]
                continue
            datasets[i] = self._build_blends(prefixes, weights, split_spoof, sizes_spoof)[i]
        return datasets

    def _build_blends(
        self,
        prefixes: list[str],
        weights: list[float] | None,
        split: list[Any],
        sizes: list[int | None],
    ) -> list[Any]:
        """Mid-level datasets per prefix, blended per split (or one prefix as is)."""
        if weights is not None:
            weights = normalize(weights)
        if len(prefixes) == 1 and (weights is None or self.config.blend_per_split is not None):
            return self._build_megatron_dataset_splits(prefixes[0], split, sizes)
        if weights is None:
            sizes_buffer = [[None] * len(Split) for _ in prefixes]
        else:
            sizes_target = _get_size_per_split_per_dataset(weights, sizes)
            sizes_buffer = _get_size_per_split_per_dataset(
                weights, sizes, surplus=self.config.mid_level_dataset_surplus
            )
        megatron_datasets = self._build_megatron_datasets_serial(prefixes, split, sizes_buffer)
        blended: list[Any] = [None] * len(Split)
        for i in range(len(Split)):
            if split[i] is None or sizes[i] == 0:
                continue  # None on every rank: 0 samples requested (--eval-iters 0)
            if any((p, i) in self._unrequested_empty for p in prefixes):
                continue  # None on every rank: an empty split with 0 requested
            weights_i = weights
            if weights_i is not None and sizes[i] is not None:
                size_i = sum(list(zip(*sizes_target))[i])
            elif weights_i is None:
                try:
                    weights_i = [len(d) for d in megatron_datasets[i]]
                except TypeError:
                    weights_i = [0 for _ in prefixes]
                size_i = None if sizes[i] is None else min(sizes[i], sum(weights_i))
            else:
                raise ValueError("blend weights need a requested size for every split")
            blended[i] = self.build_generic_dataset(
                BlendedDataset,
                self.is_built_on_rank,
                True,
                megatron_datasets[i],
                weights_i,
                size_i,
                self.config,
            )
        return blended

    def _build_megatron_datasets_serial(
        self, prefixes: list[str], split: list[Any], sizes_per_dataset: list[list[Any]]
    ) -> list[list[Any]]:
        """For each split, the list of mid-level datasets (one per prefix)."""
        out: list[list[Any]] = [[] for _ in range(len(Split))]
        rank = _dist_rank()
        if rank is not None:  # every rank, before the others wait for rank 0's builds
            for prefix, sizes in zip(prefixes, sizes_per_dataset):
                low_level = self.cls.build_low_level_dataset(prefix, self.config)
                self._raise_if_empty(prefix, split, sizes, low_level)

        def build_all() -> None:
            for prefix, sizes in zip(prefixes, sizes_per_dataset):
                per_split = self._build_megatron_dataset_splits(prefix, split, sizes, False)
                for j, dataset in enumerate(per_split):
                    out[j].append(dataset)

        if rank is None:
            build_all()
        elif rank == 0:  # rank 0 builds (and caches) first; the others then load
            error = None
            try:
                build_all()
            except Exception as err:
                error = err
            _share_rank0_error(error)
        else:
            _share_rank0_error(None)
            build_all()
        return out

    def _build_megatron_dataset_splits(
        self,
        dataset_path: str | None,
        split: list[Any],
        sizes: list[int | None],
        synchronize_ranks: bool = True,
    ) -> list[MidLevelDataset | None]:
        """Mid-level datasets for each split of one low-level dataset."""
        low_level = self.cls.build_low_level_dataset(dataset_path, self.config)
        bounds = self._raise_if_empty(dataset_path, split, sizes, low_level)
        datasets: list[MidLevelDataset | None] = []
        for i, split_name in enumerate(Split):
            if split[i] is None:
                datasets.append(None)
                continue
            beg, end = bounds[i]
            if beg == end and sizes[i] == 0:  # nothing requested from an empty split
                self._unrequested_empty.add((dataset_path, i))
                datasets.append(None)
                continue
            indices = numpy.arange(beg, end, dtype=numpy.int32)
            datasets.append(
                self.build_generic_dataset(
                    self.cls,
                    self.is_built_on_rank,
                    synchronize_ranks,
                    low_level,
                    dataset_path,
                    indices,
                    sizes[i],
                    split_name,
                    self.config,
                )
            )
        return datasets

    def _raise_if_empty(self, dataset_path, split, sizes, low_level) -> list:
        """Each split's [beg, end) of the low-level dataset's elements (None where the split is
        None); ValueError when samples are requested from a corpus without tokens or from an
        empty split. Called on every rank before any barrier (a blend's ranks != 0 wait for
        rank 0's builds: raised only on rank 0, it left them waiting)."""
        num_elements = self.cls.numel_low_level_dataset(low_level)
        tokens = _corpus_tokens(low_level)
        requested = [(n, s) for n, s, b in zip(Split, sizes, split) if b is not None and s]
        if tokens == 0 and requested:
            raise ValueError(_no_tokens_message(low_level, *requested[0]))
        bounds = [
            None
            if bookend is None
            else (int(round(bookend[0] * num_elements)), int(round(bookend[1] * num_elements)))
            for bookend in split
        ]
        for i, split_name in enumerate(Split):
            if bounds[i] is not None and bounds[i][0] == bounds[i][1] and sizes[i]:
                message = _empty_split_message(
                    self.config, dataset_path, split_name, num_elements, sizes[i]
                )
                raise ValueError(message)
        return bounds

    @staticmethod
    def build_generic_dataset(
        cls: type | Callable,
        is_built_on_rank: Callable[[], bool],
        synchronize_ranks: bool,
        *args: Any,
    ) -> Any:
        """`cls(*args)` on rank 0 first, then (after a barrier) on the other ranks that want it."""
        rank = _dist_rank()
        if rank is None:
            return cls(*args)
        dataset, error = None, None
        if rank == 0 and is_built_on_rank():
            try:
                dataset = cls(*args)
            except OSError as err:
                cache = getattr(args[-1], "path_to_cache", None)
                error = OSError(
                    f"failed to build the {cls.__name__} indices ({err}); the cache directory "
                    f"({cache or 'beside the data'}) must be writable: set --data-cache-path "
                    "(path_to_cache in the dataset config) to a writable directory"
                )
                error.__cause__ = err
            except Exception as err:
                error = err
            if error is not None and not synchronize_ranks:
                raise error  # the caller shares it at its barrier
        if synchronize_ranks:
            _share_rank0_error(error)
        if rank != 0 and is_built_on_rank():
            dataset = cls(*args)
        return dataset


def _empty_split_message(config, dataset_path, split: Split, num_elements: int, size: int) -> str:
    """An empty split asked for samples. Megatron never returns here: GPTDataset._get_num_epochs
    adds 0 tokens per epoch forever. A small corpus under the default split 969,30,1 does it
    (445 sequences: the test split's 0.1% rounds to none)."""
    if config.split is None:  # blend_per_split: the split's corpus itself is empty
        share, fix = "", "a corpus with sequences"
    else:
        share = f" under split '{config.split}' (--split)"
        other = "98,2,0 (no test split)" if split == Split.test else "90,5,5 (say)"
        fix = f"--split {other}, a larger corpus"
    return (
        f"empty corpus: the {split.name} split of {dataset_path} has 0 of its {num_elements} "
        f"sequences{share} but {size} samples were requested; use {fix}, or request none "
        "(--eval-iters 0 for the valid and test splits)"
    )


def _corpus_tokens(low_level) -> int | None:
    """Tokens of an IndexedDataset, read off its index (the last sequence's end; no data read),
    or None for another low-level dataset (the mock one)."""
    if not isinstance(low_level, IndexedDataset):
        return None
    index = low_level.index
    if len(index) == 0:
        return 0
    return int(index.sequence_pointers[-1]) // index.dtype_size + int(index.sequence_lengths[-1])


def _no_tokens_message(low_level: IndexedDataset, split: Split, size: int) -> str:
    count = len(low_level.index)
    what = f"its {count} sequences are all empty" if count else "it has no sequences"
    return (
        f"empty corpus: {get_bin_path(low_level.path_prefix)} holds no tokens ({what}) but "
        f"{size} {split.name} samples were requested; a corpus needs documents with tokens "
        "(write it again with `gigatron preprocess` from non-empty text)"
    )


def _share_rank0_error(error: BaseException | None) -> None:
    """Where the ranks wait for rank 0's build (in place of a barrier): rank 0 sends its error
    (`error`, or None) and every rank raises it, rank 0 its own exception, the others one of
    the same built-in type with the same one-line message. A failure raised on rank 0 alone
    left the others at the barrier until gloo's 'connection closed'. The text travels as bytes
    in a tensor (no pickle)."""
    dist = torch.distributed
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    text = b"" if error is None else f"{type(error).__name__}:{error}".encode()
    size = torch.tensor([len(text)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if int(size.item()) == 0:
        return
    if error is not None:
        payload = torch.tensor(list(text), dtype=torch.uint8, device=device)
    else:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=0)
    if error is not None:
        raise error
    kind, message = bytes(payload.cpu().tolist()).decode().split(":", 1)
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            same = cls(message)
        except TypeError:  # a built-in error whose constructor takes more than a message
            pass
        else:
            raise same
    raise RuntimeError(f"rank 0 failed to build the datasets: {kind}: {message}")


def _get_size_per_split_per_dataset(
    normalized_weights: list[float], target_size_per_split: list[int | None], surplus: float = 0.0
) -> list[list[int]]:
    """ceil(ceil(size * weight) * (1 + surplus)) samples per dataset per split."""
    assert numpy.isclose(sum(normalized_weights), 1.0)
    return [
        [int(math.ceil(math.ceil(size * weight) * (1 + surplus))) for size in target_size_per_split]
        for weight in normalized_weights
    ]
