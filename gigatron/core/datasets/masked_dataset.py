"""Base of the masked WordPiece datasets (BERT, T5): sample index and masked-LM predictions.

Mirrors `megatron.core.datasets.masked_dataset` (MaskedWordPieceDatasetConfig,
MaskedWordPieceDataset). The unit is the *document* of the IndexedDataset; a sample is a run of
consecutive sentences (sequences) of one document, as Megatron's C++ `helpers.build_mapping`
picks them. `build_mapping` here is a NumPy/Python port of it with the same random streams
(std::mt19937 for target lengths = NumPy's MT19937 with legacy seeding; std::mt19937_64 for the
shuffle, implemented below), so the same files and config give Megatron's samples exactly.
`_create_masked_lm_predictions` follows Megatron's N-gram masking draw for draw.
"""

from __future__ import annotations

import logging
import os
from abc import abstractmethod
from dataclasses import dataclass

import numpy
import torch

from gigatron.core.datasets._index_cache import (
    cache_description,
    check,
    description_matches,
    load_index,
    save_cache,
)
from gigatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.core.datasets.megatron_dataset import MegatronDataset
from gigatron.core.datasets.utils import Split, log_single_rank

logger = logging.getLogger(__name__)

_LONG_SENTENCE_LEN = 512  # documents with a longer sentence are skipped (Megatron's rule)
_M64 = (1 << 64) - 1


@dataclass
class MaskedWordPieceDatasetConfig(BlendedMegatronDatasetConfig):
    """Config of the masked WordPiece datasets (all masking fields are required)."""

    masking_probability: float = None
    """The probability we mask a candidate N-gram."""

    short_sequence_probability: float = None
    """The probability we return a sequence shorter than the target sequence length."""

    masking_max_ngram: int = None
    """The maximum length N-gram to consider masking or permuting."""

    masking_do_full_word: bool = None
    """Whether we mask whole words (a word piece "##x" joins the previous candidate)."""

    masking_do_permutation: bool = None
    """Whether we shuffle a subset of candidate N-grams in addition."""

    masking_use_longer_ngrams: bool = None
    """Whether to favor longer N-grams over shorter N-grams."""

    masking_use_geometric_distribution: bool = None
    """Whether to draw the N-gram size from a geometric distribution (SpanBERT, p = 0.2)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "tokenizer",
            "masking_probability",
            "short_sequence_probability",
            "masking_max_ngram",
            "masking_do_full_word",
            "masking_do_permutation",
            "masking_use_longer_ngrams",
            "masking_use_geometric_distribution",
        ):
            if getattr(self, name) is None:
                raise ValueError(f"{name} (None) must be set in {type(self).__name__}")
        if not 0 < self.masking_probability < 1:
            raise ValueError(f"masking_probability ({self.masking_probability}) must be in (0, 1)")
        if not 0 <= self.short_sequence_probability <= 1:
            raise ValueError(
                f"short_sequence_probability ({self.short_sequence_probability}) must be in [0, 1]"
            )
        if self.masking_max_ngram <= 0:
            raise ValueError(f"masking_max_ngram ({self.masking_max_ngram}) must be > 0")
        if self.masking_use_geometric_distribution and self.masking_do_permutation:
            raise ValueError(
                "masking_use_geometric_distribution (True) and masking_do_permutation (True) "
                "cannot both be set"
            )


def _mt19937_64(seed: int, count: int) -> numpy.ndarray:
    """The first `count` outputs of C++ std::mt19937_64(seed), uint64 (vectorized twist)."""
    nn, mm = 312, 156
    state = [seed & _M64]
    for i in range(1, nn):
        prev = state[-1]
        state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & _M64)
    mt = numpy.array(state, dtype=numpy.uint64)
    upper, lower = numpy.uint64(0xFFFFFFFF80000000), numpy.uint64(0x7FFFFFFF)
    matrix = numpy.uint64(0xB5026F5AA96619E9)
    one = numpy.uint64(1)
    out = []
    for _ in range(-(-count // nn)):
        for lo, hi in ((0, nn - mm), (nn - mm, nn - 1), (nn - 1, nn)):
            i = numpy.arange(lo, hi)
            x = (mt[i] & upper) | (mt[(i + 1) % nn] & lower)
            mag = numpy.where((x & one) == one, matrix, numpy.uint64(0))
            mt[i] = mt[(i + mm) % nn] ^ (x >> one) ^ mag
        y = mt.copy()
        y ^= (y >> numpy.uint64(29)) & numpy.uint64(0x5555555555555555)
        y ^= (y << numpy.uint64(17)) & numpy.uint64(0x71D67FFFEDA60000)
        y ^= (y << numpy.uint64(37)) & numpy.uint64(0xFFF7EEE000000000)
        y ^= y >> numpy.uint64(43)
        out.append(y)
    return numpy.concatenate(out)[:count] if out else numpy.zeros(0, numpy.uint64)


def build_mapping(
    docs: numpy.ndarray,
    sizes: numpy.ndarray,
    num_epochs: int,
    max_num_samples: int,
    max_seq_length: int,
    short_seq_prob: float,
    seed: int,
    verbose: bool = False,
    min_num_sent: int = 2,
) -> numpy.ndarray:
    """Megatron's `helpers.build_mapping`: rows (first sentence, end sentence, target length).

    docs: int64 [D+1] sentence boundaries of the documents; sizes: int32 sentence lengths.
    Epochs are walked until at least `max_num_samples` rows exist (whole epochs); documents
    with fewer than `min_num_sent` sentences or a sentence over 512 tokens are skipped. A target
    length is drawn per sample (short with probability `short_seq_prob`); a sample ends once it
    reaches the target, keeping >= 2 sentences for the rest of the document. The rows are then
    shuffled (Fisher-Yates with std::mt19937_64(seed + 1)). Returns uint32 [N, 3].
    """
    ratio = int(round(1.0 / short_seq_prob)) if short_seq_prob > 0 else 0
    bit_gen = numpy.random.MT19937()
    bit_gen._legacy_seeding(seed)  # == std::mt19937(seed)

    def target_len() -> int:
        if ratio == 0:
            return max_seq_length
        r = int(bit_gen.random_raw())
        return 2 + r % (max_seq_length - 1) if r % ratio == 0 else max_seq_length

    docs = numpy.asarray(docs, dtype=numpy.int64).tolist()
    sizes = numpy.asarray(sizes).tolist()
    usable, num_short, num_long = [], 0, 0
    for doc, (first, last) in enumerate(zip(docs[:-1], docs[1:])):
        long_sentence = last - first > 1 and max(sizes[first:last]) > _LONG_SENTENCE_LEN
        num_short += last - first < min_num_sent
        num_long += long_sentence and last - first >= min_num_sent
        if last - first >= min_num_sent and not long_sentence:
            usable.append(doc)
    if not usable and num_epochs > 1 and max_num_samples > 0:
        # every epoch would add no row: the loop below would never reach max_num_samples
        _raise_no_usable_document(len(docs) - 1, num_short, num_long, min_num_sent)
    rows: list[tuple[int, int, int]] = []
    for _ in range(num_epochs):  # each epoch adds >= len(usable) rows
        if len(rows) >= max_num_samples:
            break
        for doc in usable:
            first, last = docs[doc], docs[doc + 1]
            start, seq_len, num_sent, remain = first, 0, 0, last - first
            target = target_len()
            for sent in range(first, last):
                seq_len += sizes[sent]
                num_sent += 1
                remain -= 1
                if (seq_len >= target and remain > 1 and num_sent >= min_num_sent) or remain == 0:
                    rows.append((start, sent + 1, target))
                    start, seq_len, num_sent = sent + 1, 0, 0
                    target = target_len()
    maps = numpy.array(rows, dtype=numpy.uint32).reshape(-1, 3)
    n = len(maps)
    if n > 1:
        draws = _mt19937_64(seed + 1, n - 1)
        for k, i in enumerate(range(n - 1, 0, -1)):
            j = int(draws[k] % numpy.uint64(i + 1))
            maps[[i, j]] = maps[[j, i]]
    return maps


def _raise_no_usable_document(num_docs: int, num_short: int, num_long: int, min_num_sent: int):
    hint = ""
    if min_num_sent > 1:
        hint = (
            f" BERT's binary (next-sentence) head needs documents of >= {min_num_sent} "
            "sentences: preprocess the corpus with --split-sentences (one sequence per "
            "sentence), or train without the head (--bert-no-binary-head; "
            "classification_head=False in BERTMaskedWordPieceDatasetConfig)."
        )
    if num_long:
        hint += f" Documents with a sentence over {_LONG_SENTENCE_LEN} tokens are skipped."
    raise ValueError(
        f"no document can give a masked-LM sample: of the {num_docs} documents, {num_short} have "
        f"fewer than {min_num_sent} sentences (sequences) and {num_long} have a sentence over "
        f"{_LONG_SENTENCE_LEN} tokens.{hint}"
    )


class MaskedWordPieceDataset(MegatronDataset):
    """Semi-abstract base: subclasses set `self.sample_index` and implement `_get_token_mask`
    and `__getitem__`. WordPiece marks non-initial pieces of a word with a leading "##"."""

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str,
        indexed_indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: MaskedWordPieceDatasetConfig,
    ) -> None:
        super().__init__(
            indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config
        )

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        """Number of documents (the split fractions apply to documents)."""
        return low_level_dataset.document_indices.shape[0] - 1

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config) -> IndexedDataset:
        return IndexedDataset(dataset_path)

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return MegatronDataset._key_config_attributes() + [
            "masking_probability",
            "short_sequence_probability",
            "masking_max_ngram",
            "masking_do_full_word",
            "masking_do_permutation",
            "masking_use_longer_ngrams",
            "masking_use_geometric_distribution",
        ]

    def __len__(self) -> int:
        return self.sample_index.shape[0]

    def _build_sample_index(self, sequence_length: int, min_sentences_per_sample: int):
        """Build (rank 0 / no distributed) or load `{hash}-{Class}-sample_index.npy`."""
        path_to_cache = self.config.path_to_cache
        if path_to_cache is None:
            path_to_cache = os.path.join(
                self.dataset.path_prefix, "cache", f"{type(self).__name__}_indices"
            )
        base = os.path.join(path_to_cache, f"{self.unique_description_hash}-{type(self).__name__}")
        path_description, path_index = f"{base}-description.txt", f"{base}-sample_index.npy"
        cache_hit = os.path.isfile(path_description) and os.path.isfile(path_index)
        # Megatron walks "all the epochs it takes" when a size is asked for, else one epoch.
        num_epochs = numpy.iinfo(numpy.int32).max - 1 if self.num_samples is not None else 1
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        writer = not dist_on or torch.distributed.get_rank() == 0
        description = cache_description(
            self.unique_description, [getattr(self.dataset, "fingerprint", None)]
        )
        if cache_hit or not writer:
            cached = load_index(path_index, ndim=2, width=3)
            if (
                cached is not None
                and description_matches(path_description, description)
                and check(path_index, self._cached_index_problem(cached, sequence_length))
            ):
                return cached
        # no cache or a stale one: build it (only the writer rank stores it)
        log_single_rank(logger, logging.INFO, f"Build the {type(self).__name__} indices")
        indices = numpy.append(self.indices, self.indices[-1] + 1)
        sample_index = build_mapping(
            self.dataset.document_indices[indices],
            self.dataset.sequence_lengths,
            num_epochs,
            self.num_samples if self.num_samples is not None else 2**63 - 1,
            sequence_length,
            self.config.short_sequence_probability,
            self.config.random_seed,
            False,
            min_sentences_per_sample,
        )
        if writer:
            os.makedirs(path_to_cache, exist_ok=True)
            save_cache(path_description, description, {path_index: sample_index})
        return sample_index

    def _cached_index_problem(self, sample_index: numpy.ndarray, sequence_length: int):
        """Why a cached `[n, 3]` (first sequence, end sequence, target length) index cannot be
        this split's, or None: sequences outside the split's documents, an empty or reversed
        range, a target length outside [0, sequence_length]."""
        if not len(sample_index):
            return None
        if not len(self.indices):
            return "this split has no documents"
        docs = self.dataset.document_indices
        low, high = int(docs[self.indices[0]]), int(docs[self.indices[-1] + 1])
        beg, end, target = sample_index[:, 0], sample_index[:, 1], sample_index[:, 2]
        if int(beg.min()) < low or int(end.max()) > high or (end <= beg).any():
            return f"a sample's sequences lie outside this split's [{low}, {high}) or are empty"
        if int(target.min()) < 0 or int(target.max()) > sequence_length:
            return f"a target length lies outside [0, {sequence_length}]"
        return None

    def _create_masked_lm_predictions(self, token_ids: list[int], target_sequence_length: int,
                                      numpy_random_state: numpy.random.RandomState):  # fmt: skip
        """Mask N-grams of whole words (per config). Returns (masked_token_ids,
        masked_positions, masked_labels, boundaries, masked_spans) as Megatron's."""
        return _create_masked_lm_predictions(
            self.config, token_ids, target_sequence_length, numpy_random_state, self._get_token_mask
        )

    @abstractmethod
    def _get_token_mask(self, numpy_random_state: numpy.random.RandomState) -> int | None:
        """The replacement of a masked token (None keeps the original)."""


def _candidates(config, token_ids: list[int]) -> tuple[list[int], list[list[int]]]:
    """Word boundaries (1 at [CLS]/[SEP] and word starts) and candidate index groups."""
    tok = config.tokenizer
    boundaries, candidates = [], []
    for i, token_id in enumerate(token_ids):
        if token_id == tok.cls or token_id == tok.sep:
            boundaries.append(1)
        elif not tok.inv_vocab[token_id].startswith("##"):
            boundaries.append(1)
            candidates.append([i])
        else:
            boundaries.append(0)
            if config.masking_do_full_word and len(candidates) > 0:
                candidates[-1].append(i)
            else:
                candidates.append([i])
    return boundaries, candidates


def _pick_ngram(ngrams, n, budget: int, used: int):
    """Shrink n until the n-gram fits the budget; None when even a 1-gram does not."""
    while True:
        indices = sum(ngrams[n - 1], [])
        n -= 1
        if budget >= used + len(indices):
            return indices
        if n == 0:
            return None


def _create_masked_lm_predictions(config, token_ids, target_sequence_length, rng, get_mask):
    """Megatron's N-gram masking (and optional permutation), draw for draw."""
    boundaries, candidates = _candidates(config, token_ids)
    n_maskings = min(
        config.masking_probability * target_sequence_length,
        max(1, int(round(len(token_ids) * config.masking_probability))),
    )
    ngram_nvals = numpy.arange(config.masking_max_ngram, dtype=numpy.int64) + 1
    nprobs = 1.0 / ngram_nvals
    nprobs = nprobs / nprobs.sum(keepdims=True)
    if config.masking_use_longer_ngrams:
        nprobs = nprobs[::-1]
    # Candidate n-grams starting at each candidate: [[c_i], [c_i, c_i+1], ...] (n up to max).
    candidate_ngrams = [
        [candidates[idx : idx + n] for n in ngram_nvals] for idx in range(len(candidates))
    ]
    rng.shuffle(candidate_ngrams)

    masked_token_ids = list(token_ids)
    masked_positions_and_labels, masked_spans, masked_indices = [], [], set()
    for ngrams in candidate_ngrams:
        if len(masked_positions_and_labels) >= n_maskings:
            break
        if not ngrams:
            continue
        if config.masking_use_geometric_distribution:
            n = min(rng.geometric(0.2), config.masking_max_ngram)
        else:
            p = nprobs[: len(ngrams)] / nprobs[: len(ngrams)].sum(keepdims=True)
            n = rng.choice(ngram_nvals[: len(ngrams)], p=p)
        ngram_indices = _pick_ngram(ngrams, n, n_maskings, len(masked_positions_and_labels))
        if ngram_indices is None or any(i in masked_indices for i in ngram_indices):
            continue
        for index in ngram_indices:
            masked_indices.add(index)
            mask = get_mask(rng)
            masked_token_ids[index] = token_ids[index] if mask is None else mask
            masked_positions_and_labels.append((index, token_ids[index]))
        masked_spans.append((ngram_indices, [token_ids[i] for i in ngram_indices]))
    rng.shuffle(candidate_ngrams)

    if config.masking_do_permutation:
        permuted = set()
        for ngrams in candidate_ngrams:
            if len(permuted) >= n_maskings:
                break
            if not ngrams:
                continue
            p = nprobs[: len(ngrams)] / nprobs[: len(ngrams)].sum(keepdims=True)
            # Megatron draws this one from NumPy's global RNG, not the sample's: kept as is.
            n = numpy.random.choice(ngram_nvals[: len(ngrams)], p=p)
            ngram_indices = _pick_ngram(ngrams, n, n_maskings, len(permuted))
            if ngram_indices is None or any(
                i in masked_indices or i in permuted for i in ngram_indices
            ):
                continue
            permuted.update(ngram_indices)
        permuted = sorted(permuted)
        shuffled = list(permuted)
        rng.shuffle(shuffled)
        before = list(masked_token_ids)
        for idx, idx_copy in zip(permuted, shuffled):
            masked_token_ids[idx] = before[idx_copy]
            masked_positions_and_labels.append((idx, before[idx]))

    masked_positions_and_labels.sort(key=lambda x: x[0])
    masked_positions = [position for position, _ in masked_positions_and_labels]
    masked_labels = [label for _, label in masked_positions_and_labels]
    masked_spans.sort(key=lambda x: x[0][0])
    return masked_token_ids, masked_positions, masked_labels, boundaries, masked_spans
