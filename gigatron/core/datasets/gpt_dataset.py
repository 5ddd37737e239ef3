"""GPT pretraining samples: fixed-length token windows over shuffled, concatenated documents.

Mirrors `megatron.core.datasets.gpt_dataset`. Three cached indices decide every sample, built
from one `numpy.random.RandomState(random_seed)` used in this order:
  1. document index: the split's sequence ids tiled over the epochs, shuffled (the last epoch
     shuffled on its own when it would contribute < 80% of an epoch's samples);
  2. sample index `[num_samples + 1, 2]`: (document-index position, token offset) of each sample
     start (helpers.build_sample_idx); consecutive samples overlap by one token;
  3. shuffle index: a permutation of the samples (two ranges when the last epoch is separate).
Same seed and files give the same samples and the same cache file names as Megatron.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

from gigatron.core.datasets import helpers
from gigatron.core.datasets._index_cache import (
    cache_description,
    check,
    description_matches,
    is_permutation,
    load_index,
    out_of_range,
    save_cache,
)
from gigatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.core.datasets.megatron_dataset import MegatronDataset
from gigatron.core.datasets.utils import Split, log_single_rank

logger = logging.getLogger(__name__)


@dataclass
class GPTDatasetConfig(BlendedMegatronDatasetConfig):
    """Configuration object for GPT datasets."""

    reset_position_ids: bool | None = None
    """Restart position ids after each EOD token."""

    reset_attention_mask: bool | None = None
    """Stop attention across EOD tokens (block-diagonal causal mask)."""

    eod_mask_loss: bool | None = None
    """Zero the loss mask at EOD tokens."""

    create_attention_mask: bool = True
    """Return `attention_mask` (bool `[1, s, s]`, True = masked) in each sample."""

    drop_last_partial_validation_sequence: bool = True
    """Drop the last partial sample of the validation split."""

    add_extra_token_to_sequence: bool = True
    """Read seq_len + 1 tokens per sample so tokens and labels both have seq_len entries."""

    object_storage_cache_path: str | None = None
    """Not supported by gigatron (must stay None)."""

    data_parallel_size: int = 1
    """Data-parallel size (kept for compatibility)."""

    sequence_parallel_size: int = 0
    """Sequence-parallel size (kept for compatibility)."""

    hybrid_context_parallel: bool = False
    """Not supported by gigatron (must stay False)."""

    sequences_per_dataset: dict[str, int] | None = None
    """Not supported by gigatron (must stay None)."""

    token_dtype_code: int | None = field(init=False, default=None)
    """Derived in __post_init__: IndexedDataset dtype code of the token ids, 8 (uint16) when the
    tokenizer's vocab fits in 65536 ids, else 4 (int32); None without a vocab size."""

    context_parallel_size: int | None = None
    """Context-parallel size (kept for compatibility)."""

    inter_document_masking: bool = False
    """Return `cu_seqlens` (the sample's document bounds, int32 `[s + 1]` padded with s) and
    `max_seqlen` instead of an attention mask, with position ids restarting per document:
    the batch becomes a packed (thd) one (megatron-core 0.19+; docs/packed_sequences.md)."""

    def __post_init__(self) -> None:
        # Every problem in one message (as TransformerConfig does), not one per run.
        problems = []
        try:
            super().__post_init__()
        except ValueError as e:
            problems.append(str(e))
        if self.tokenizer is None:
            problems.append("tokenizer must be set (it provides eod and pad)")
        for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss"):
            if getattr(self, name) is None:
                problems.append(f"{name} must be set to True or False")
        unsupported = {
            "object_storage_cache_path": (self.object_storage_cache_path, None),
            "hybrid_context_parallel": (self.hybrid_context_parallel, False),
            "sequences_per_dataset": (self.sequences_per_dataset, None),
        }
        for name, (value, default) in unsupported.items():
            if value != default:
                problems.append(f"{name} ({value}) is not supported by gigatron; leave it unset")
        if problems:
            raise ValueError(f"GPTDatasetConfig: {'; '.join(problems)}")
        vocab_size = self.tokenizer.vocab_size
        self.token_dtype_code = None if vocab_size is None else (4 if vocab_size > 65536 else 8)


class GPTDataset(MegatronDataset):
    """GPT samples over an IndexedDataset split. See the module docstring for the indices.

    `[idx]` returns Megatron's dict: tokens, labels (int64 `[s]`), loss_mask (float `[s]`),
    position_ids (int64 `[s]`) and, with create_attention_mask, attention_mask (bool `[1, s, s]`);
    with inter_document_masking cu_seqlens (int32 `[s + 1]`) and max_seqlen instead of the mask.
    """

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str | None,
        indexed_indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        super().__init__(
            indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config
        )
        self.masks_and_position_ids_are_cacheable = not any(
            [config.reset_position_ids, config.reset_attention_mask, config.eod_mask_loss]
        )
        self._cached_masks: tuple | None = None
        self.document_index, self.sample_index, self.shuffle_index = (
            self._build_document_sample_shuffle_indices()
        )

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        """GPT splits by sequence (not by document)."""
        return low_level_dataset.sequence_lengths.shape[0]

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        return IndexedDataset(dataset_path, multimodal=False, mmap=config.mmap_bin_files)

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        """Sample `idx` (None: a fully loss-masked padding sample)."""
        text, document_lengths = self._sample_tokens_and_document_lengths(idx or 0)
        text = torch.from_numpy(text).long()
        extra = self.config.add_extra_token_to_sequence
        if extra:
            tokens, labels = text[:-1].contiguous(), text[1:].contiguous()
        else:
            tokens = text
            labels = torch.roll(text, shifts=-1, dims=0)
            labels[-1] = self._pad_token_id

        if self.masks_and_position_ids_are_cacheable and self._cached_masks is not None:
            attention_mask, loss_mask, position_ids = self._cached_masks
            loss_mask = loss_mask.clone()
        else:
            attention_mask, loss_mask, position_ids = _get_ltor_masks_and_position_ids(
                tokens,
                self.config.tokenizer.eod,
                self.config.reset_position_ids,
                self.config.reset_attention_mask,
                self.config.eod_mask_loss,
                self.config.create_attention_mask,
            )
            if self.masks_and_position_ids_are_cacheable:
                self._cached_masks = (attention_mask, loss_mask.clone(), position_ids)

        loss_mask[labels == self._pad_token_id] = 0.0
        tokens[tokens == self._pad_token_id] = 0
        labels[labels == self._pad_token_id] = 0
        if idx is None:
            loss_mask = torch.zeros_like(loss_mask)

        sample = {"tokens": tokens, "labels": labels}
        if self.config.inter_document_masking:
            return {**sample, **self._packed_fields(document_lengths, loss_mask)}
        if self.config.create_attention_mask:
            sample["attention_mask"] = attention_mask
        sample["loss_mask"] = loss_mask
        sample["position_ids"] = position_ids
        return sample

    def _packed_fields(self, document_lengths: list[int], loss_mask: torch.Tensor) -> dict:
        """loss_mask, per-document position_ids [s], cu_seqlens int32 [s + 1] and max_seqlen
        of a sample whose documents hold `document_lengths` of its seq_len + extra tokens.
        cu_seqlens keeps a fixed length (trailing entries = s) so samples stack; the extra
        label token leaves the last document and padding joins it (megatron-core's layout)."""
        seq_len = self.config.sequence_length
        lengths = list(document_lengths)
        if self.config.add_extra_token_to_sequence:
            lengths[-1] -= 1
            if lengths[-1] == 0:
                lengths.pop()
        shortfall = seq_len - sum(lengths)
        if shortfall > 0:
            lengths = lengths[:-1] + [lengths[-1] + shortfall] if lengths else [shortfall]
        bounds = numpy.cumsum([0, *lengths])
        cu_seqlens = torch.full((seq_len + 1,), seq_len, dtype=torch.int32)
        cu_seqlens[: len(bounds)] = torch.from_numpy(bounds)
        starts = torch.from_numpy(numpy.repeat(bounds[:-1], lengths))  # each token's doc start
        return {
            "loss_mask": loss_mask,
            "position_ids": torch.arange(seq_len) - starts,
            "cu_seqlens": cu_seqlens,
            "max_seqlen": torch.tensor(max(lengths), dtype=torch.int32),
        }

    def _query_document_sample_shuffle_indices(self, idx: int) -> numpy.ndarray:
        """int64 `[seq_len + extra]` tokens of sample `idx` (padded with the pad id at the end)."""
        return self._sample_tokens_and_document_lengths(idx)[0]

    def _sample_tokens_and_document_lengths(self, idx: int) -> tuple[numpy.ndarray, list[int]]:
        """Tokens of sample `idx` as above, and how many of them each document piece holds
        (padding not counted)."""
        extra = int(self.config.add_extra_token_to_sequence)
        idx = self.shuffle_index[idx]
        beg, beg_offset = (int(x) for x in self.sample_index[idx])
        end, end_offset = (int(x) for x in self.sample_index[idx + 1])
        parts = []
        if beg == end:
            doc = self.document_index[beg]
            parts.append(
                self.dataset.get(doc, offset=beg_offset, length=end_offset - beg_offset + extra)
            )
        else:
            for i in range(beg, end + 1):
                offset = beg_offset if i == beg else 0
                length = end_offset + extra if i == end else None
                parts.append(self.dataset.get(self.document_index[i], offset=offset, length=length))
        lengths = [len(p) for p in parts]
        self._check_token_ids(parts, idx)
        want = self.config.sequence_length + extra
        if sum(lengths) < want:
            parts.append(numpy.full(want - sum(lengths), self._pad_token_id, dtype=numpy.int64))
        return numpy.concatenate(parts, dtype=numpy.int64), lengths

    def _check_token_ids(self, parts: list[numpy.ndarray], sample: int) -> None:
        """A token id outside [0, vocab_size) of the tokenizer is an error naming the corpus
        (the model's own check cannot say which file the id came from). Two reductions over the
        sample's tokens; skipped without a vocab size."""
        vocab_size = getattr(self.config.tokenizer, "vocab_size", None)
        if not isinstance(vocab_size, int) or not parts:
            return
        for part in parts:
            if part.size and (int(part.min()) < 0 or int(part.max()) >= vocab_size):
                bad = int(part.min()) if int(part.min()) < 0 else int(part.max())
                raise ValueError(
                    f"token id {bad} in --data-path {self.dataset_path} ({self.index_split.name}"
                    f" sample {sample}) is outside the tokenizer's vocabulary [0, {vocab_size}): "
                    "was the corpus written with another tokenizer?"
                )

    def _cache_dir(self) -> str | None:
        if self.config.path_to_cache is not None:
            return self.config.path_to_cache
        if self.config.mock:
            return None
        return os.path.join(self.dataset.path_prefix, "cache", f"{type(self).__name__}_indices")

    def _build_document_sample_shuffle_indices(self) -> tuple[Any, Any, Any]:
        """Build the three indices (rank 0 or no distributed), or load them from the cache."""
        path_to_cache = self._cache_dir()
        paths = {}
        if path_to_cache:
            base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}"
            for affix in ("description.txt", "document_index.npy", "sample_index.npy"):
                paths[affix] = os.path.join(path_to_cache, f"{base}-{affix}")
            paths["shuffle_index.npy"] = os.path.join(path_to_cache, f"{base}-shuffle_index.npy")
        cache_hit = bool(paths) and all(os.path.isfile(p) for p in paths.values())
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        writer = not dist_on or torch.distributed.get_rank() == 0
        if path_to_cache and (cache_hit or not writer):
            log_single_rank(
                logger,
                logging.INFO,
                f"Load the {type(self).__name__} {self.index_split.name} indices",
            )
            cached = self._load_cached_indices(paths)
            if cached is not None:
                return cached
        indices = self._build_indices()
        if path_to_cache and writer:
            os.makedirs(path_to_cache, exist_ok=True)
            names = ("document_index", "sample_index", "shuffle_index")
            save_cache(
                paths["description.txt"],
                self._cache_description(),
                {paths[f"{n}.npy"]: a for n, a in zip(names, indices)},
            )
        return indices

    def _cache_description(self) -> str:
        """description.txt: Megatron's description and the corpus files' fingerprint."""
        return cache_description(
            self.unique_description, [getattr(self.dataset, "fingerprint", None)]
        )

    def _load_cached_indices(self, paths: dict[str, str]) -> tuple | None:
        """The three cached indices, or None (stale cache, warned) to rebuild them."""
        if not description_matches(paths["description.txt"], self._cache_description()):
            return None
        out = (
            load_index(paths["document_index.npy"], ndim=1),
            load_index(paths["sample_index.npy"], ndim=2, width=2),
            load_index(paths["shuffle_index.npy"], ndim=1),
        )
        if any(a is None for a in out):
            return None
        problems = self._cached_index_problems(*out)
        for name, problem in zip(("document_index", "sample_index", "shuffle_index"), problems):
            if not check(paths[f"{name}.npy"], problem):
                return None
        return out

    def _cached_index_problems(self, document_index, sample_index, shuffle_index) -> list:
        """Why each cached index cannot be this dataset's (None when it can). O(n) passes: the
        document index tiles this split's sequences over the epochs; the sample index walks the
        document index forward with offsets inside each document; the shuffle index is a
        permutation of the samples."""
        problems: list[str | None] = [None, None, None]
        num_docs = len(self.indices)
        expected = self._get_num_epochs(self._get_num_tokens_per_epoch()) * num_docs
        if document_index.shape != (expected,):
            problems[0] = f"{document_index.shape[0]} entries, this split needs {expected}"
        elif num_docs:
            low, high = int(numpy.min(self.indices)), int(numpy.max(self.indices)) + 1
            problems[0] = out_of_range(document_index, low, high, "it")
        if problems[0] is not None:
            return problems
        docs, offsets = sample_index[:, 0], sample_index[:, 1]
        problems[1] = out_of_range(docs, 0, max(len(document_index), 1), "column 0")
        if problems[1] is None and len(docs) > 1:
            step, advance = numpy.diff(docs), numpy.diff(offsets)
            if ((step < 0) | ((step == 0) & (advance < 0))).any():
                problems[1] = "its samples do not walk the document index forward"
        if problems[1] is None and len(document_index):
            lengths = numpy.asarray(self.dataset.sequence_lengths)[document_index[docs]]
            if (offsets < 0).any() or (offsets > lengths).any():
                problems[1] = "an offset lies outside its document"
        if problems[1] is not None:
            return problems
        num_samples = max(sample_index.shape[0] - 1, 0)
        if not is_permutation(shuffle_index, num_samples):
            problems[2] = f"it is not a permutation of the {num_samples} samples"
        return problems

    def _build_indices(self) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        seq_len = self.config.sequence_length
        extra = int(self.config.add_extra_token_to_sequence)
        tokens_per_epoch = self._get_num_tokens_per_epoch()
        num_epochs = self._get_num_epochs(tokens_per_epoch)

        separate_final_epoch = False
        if num_epochs > 1:
            samples_sans_final = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_len
            samples_from_final = self.num_samples - samples_sans_final
            samples_per_epoch = (tokens_per_epoch - extra) // seq_len
            assert 0 <= samples_from_final <= samples_per_epoch + 1
            separate_final_epoch = samples_from_final < int(0.80 * samples_per_epoch)

        rng = numpy.random.RandomState(self.config.random_seed)
        document_index = _build_document_index(self.indices, num_epochs, rng, separate_final_epoch)
        drop_last = True
        if self.index_split == Split.valid:
            drop_last = self.config.drop_last_partial_validation_sequence
        sizes = numpy.asarray(self.dataset.sequence_lengths)
        if len(document_index) * 2 > len(sizes):
            # The lengths sit at byte 34 of the .idx: a misaligned int32 view that NumPy gathers
            # from slowly. Dense access pays for one aligned copy (Megatron copies here too).
            sizes = numpy.array(sizes)
        sample_index = helpers.build_sample_idx(
            sizes,
            document_index,
            seq_len,
            num_epochs,
            tokens_per_epoch,
            drop_last,
            bool(extra),
        )
        num_built = sample_index.shape[0] - 1
        first_range = samples_sans_final if separate_final_epoch else num_built
        shuffle_index = _build_shuffle_index(first_range, num_built, rng)
        return document_index, sample_index, shuffle_index

    def _get_num_tokens_per_epoch(self) -> int:
        return int(numpy.sum(self.dataset.sequence_lengths[self.indices], dtype=numpy.int64))

    def _get_num_epochs(self, num_tokens_per_epoch: int) -> int:
        """Smallest e with e * tokens_per_epoch >= num_samples * seq_len + extra."""
        if self.num_samples is None:
            return 1
        requested = self.num_samples * self.config.sequence_length + int(
            self.config.add_extra_token_to_sequence
        )
        if num_tokens_per_epoch <= 0:
            raise ValueError(
                f"empty corpus: the {self.index_split.name} split of {self.dataset_path} has no "
                f"tokens ({len(self.indices)} sequences) but {self.num_samples} samples were "
                "requested"
            )
        return max(1, -(-requested // num_tokens_per_epoch))


def _build_document_index(
    documents: numpy.ndarray,
    num_epochs: int,
    rng: numpy.random.RandomState,
    separate_final_epoch: bool,
) -> numpy.ndarray:
    """int32 `[num_epochs * len(documents)]`: documents tiled per epoch, shuffled."""
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.tile(numpy.asarray(documents, dtype=numpy.int32), num_epochs)
        rng.shuffle(document_index)
        return document_index
    first = _build_document_index(documents, num_epochs - 1, rng, False)
    last = _build_document_index(documents, 1, rng, False)
    return numpy.concatenate((first, last))


def _build_shuffle_index(
    num_samples: int, total_size: int, rng: numpy.random.RandomState
) -> numpy.ndarray:
    """Shuffled `arange(num_samples)`, then shuffled `arange(num_samples, total_size)`."""
    dtype = numpy.uint32 if total_size < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return numpy.concatenate((first, last))


def _get_ltor_masks_and_position_ids(
    data: torch.Tensor,
    eod_token: int,
    reset_position_ids: bool,
    reset_attention_mask: bool,
    eod_mask_loss: bool,
    create_attention_mask: bool,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Causal mask (bool `[1, s, s]`, True = masked), loss mask `[s]`, position ids `[s]`.

    With resets, a document starts after each EOD: attention does not cross it and position
    ids restart at 0 (the EOD itself belongs to the document it ends).
    """
    s = data.numel()
    loss_mask = torch.ones(s, dtype=torch.float)
    is_eod = data == eod_token
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0
    positions = torch.arange(s, dtype=torch.long)
    # doc[q] = number of EODs strictly before q: the document id of each position.
    doc = torch.cumsum(is_eod.long(), 0) - is_eod.long()
    position_ids = positions.clone()
    if reset_position_ids:
        starts = torch.zeros(s, dtype=torch.long)
        starts[1:] = torch.where(is_eod[:-1], positions[1:], 0)
        position_ids = positions - torch.cummax(starts, 0).values
    attention_mask = None
    if create_attention_mask:
        allowed = positions[None, :] <= positions[:, None]  # [s, s] causal: key <= query
        if reset_attention_mask:
            allowed &= doc[:, None] == doc[None, :]
        attention_mask = (~allowed).unsqueeze(0)
    return attention_mask, loss_mask, position_ids


class MockGPTLowLevelDataset:
    """100,000 synthetic sequences: `(arange(len - 1) + 1) % vocab_size` then EOD."""

    seed: int = 0
    size: int = 100000
    max_sequence_length: int = 4096

    def __init__(self, tokenizer: Any) -> None:
        self.vocab_size = tokenizer.vocab_size
        self.eod_token = tokenizer.eod
        rng = numpy.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(
            low=1, high=self.max_sequence_length, size=self.size, dtype=numpy.int32
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> numpy.ndarray:
        length = self.sequence_lengths[idx]
        body = (numpy.arange(length - 1) + 1) % self.vocab_size
        return numpy.int64(numpy.concatenate([body, [self.eod_token]]))

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> numpy.ndarray:
        if length is None:
            length = self.sequence_lengths[idx] - offset
        return self[idx][offset : offset + length]


class MockGPTDataset(GPTDataset):
    """GPTDataset over MockGPTLowLevelDataset (used when the config has no blend)."""

    def __init__(
        self,
        dataset: MockGPTLowLevelDataset,
        dataset_path: str | None,
        indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        if not config.mock:
            raise ValueError("MockGPTDataset needs a config without blend (config.mock is True)")
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: MockGPTLowLevelDataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(
        dataset_path: str | None, config: GPTDatasetConfig
    ) -> MockGPTLowLevelDataset:
        return MockGPTLowLevelDataset(config.tokenizer)
