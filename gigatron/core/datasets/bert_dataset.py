"""BERT masked-LM (+ next-sentence) samples over an IndexedDataset of sentences.

Mirrors `megatron.core.datasets.bert_dataset` (BERTMaskedWordPieceDatasetConfig,
BERTMaskedWordPieceDataset). A sample is 2+ sentences of one document (1+ without the
classification head) split into A and B at a random pivot, swapped with probability 1/2 (the
"is_random" label), trimmed to the target length, laid out as [CLS] A [SEP] B [SEP] and masked
80/10/10 ([MASK] / random token / unchanged). Each sample draws from
RandomState((random_seed + idx) % 2**32), so samples are identical to Megatron's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.core.datasets.masked_dataset import (
    MaskedWordPieceDataset,
    MaskedWordPieceDatasetConfig,
)
from gigatron.core.datasets.utils import Split


@dataclass
class BERTMaskedWordPieceDatasetConfig(MaskedWordPieceDatasetConfig):
    """Config of BERTMaskedWordPieceDataset."""

    classification_head: bool = None
    """Whether to build next-sentence (A/B) samples for the binary head."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.classification_head is None:
            raise ValueError("classification_head (None) must be set (True or False)")


class BERTMaskedWordPieceDataset(MaskedWordPieceDataset):
    """Samples {text, types, labels, is_random, padding_mask, loss_mask, truncated}, each
    int64 [sequence_length] (ints for is_random / truncated)."""

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str,
        indexed_indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: BERTMaskedWordPieceDatasetConfig,
    ) -> None:
        super().__init__(
            indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config
        )
        self.token_lookup = list(self.config.tokenizer.inv_vocab.keys())
        # 3 places for [CLS], [SEP], [SEP]; the head needs 2 sentences per sample.
        self.sample_index = self._build_sample_index(
            self.config.sequence_length - 3, 2 if self.config.classification_head else 1
        )

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return MaskedWordPieceDataset._key_config_attributes() + ["classification_head"]

    def _split_and_trim(self, sample, target_sequence_length, rng):
        pivot, is_next_random = len(sample), False
        if self.config.classification_head:
            if len(sample) < 2:
                raise ValueError(f"a sample needs >= 2 sentences, got {len(sample)}")
            pivot = 1
            if len(sample) >= 3:
                pivot = rng.randint(low=1, high=len(sample))
            is_next_random = rng.random() < 0.5
        split_a = [t for sentence in sample[:pivot] for t in sentence]
        split_b = [t for sentence in sample[pivot:] for t in sentence]
        if is_next_random:
            split_a, split_b = split_b, split_a
        truncated = len(split_a) + len(split_b) > target_sequence_length
        while len(split_a) + len(split_b) > target_sequence_length:
            longer = split_a if len(split_a) > len(split_b) else split_b
            del longer[0 if rng.random() < 0.5 else -1]  # trim a random end of the longer
        return split_a, split_b, is_next_random, truncated

    def __getitem__(self, idx: int) -> dict:
        idx_beg, idx_end, target_sequence_length = self.sample_index[idx]
        sample = [self.dataset[i] for i in range(idx_beg, idx_end)]
        rng = numpy.random.RandomState(seed=(self.config.random_seed + idx) % 2**32)
        tok, seq_len, pad = self.config.tokenizer, self.config.sequence_length, self._pad_token_id
        split_a, split_b, is_next_random, truncated = self._split_and_trim(
            sample, target_sequence_length, rng
        )
        tokens = [tok.cls, *split_a, tok.sep]
        assignments = [0] * (len(split_a) + 2)
        if split_b:
            tokens += [*split_b, tok.sep]
            assignments += [1] * (len(split_b) + 1)
        tokens, masked_positions, masked_labels, _, _ = self._create_masked_lm_predictions(
            tokens, target_sequence_length, rng
        )
        num_pads = seq_len - len(tokens)
        if num_pads < 0:
            raise ValueError(f"sample of {len(tokens)} tokens > sequence_length ({seq_len})")
        tokens = numpy.pad(numpy.array(tokens, dtype=numpy.int64), (0, num_pads),
                           constant_values=pad)  # fmt: skip
        assignments = numpy.pad(numpy.array(assignments, dtype=numpy.int64), (0, num_pads),
                                constant_values=pad)  # fmt: skip
        # Megatron writes the pad id (not 0) into padding_mask at pad positions; kept as is.
        padding_mask = numpy.ones(seq_len, dtype=numpy.int64)
        padding_mask[tokens == pad] = pad
        labels = numpy.zeros(seq_len, dtype=numpy.int64) - 1
        labels[masked_positions] = masked_labels
        loss_mask = numpy.zeros(seq_len, dtype=numpy.int64)
        loss_mask[masked_positions] = 1
        tokens[tokens == pad] = 0
        labels[labels == pad] = 0
        return {
            "text": tokens,
            "types": assignments,
            "labels": labels,
            "is_random": int(is_next_random),
            "padding_mask": padding_mask,
            "loss_mask": loss_mask,
            "truncated": int(truncated),
        }

    def _get_token_mask(self, numpy_random_state: numpy.random.RandomState) -> int | None:
        """80%: [MASK]; 10%: a random vocabulary token; 10%: unchanged (None)."""
        if numpy_random_state.random() < 0.8:
            return self.config.tokenizer.mask
        if numpy_random_state.random() >= 0.5:
            return self.token_lookup[numpy_random_state.randint(0, len(self.token_lookup))]
        return None
