"""T5 span-corruption samples over an IndexedDataset of sentences.

Mirrors `megatron.core.datasets.t5_dataset` (T5MaskedWordPieceDatasetConfig,
T5MaskedWordPieceDataset). The masked N-gram spans of a sample (same draws as BERT's masking,
every masked token -> [MASK]) are replaced in the encoder input by one sentinel each; the decoder
input is [BOS] sentinel_1 span_1 sentinel_2 span_2 ..., its output the same without [BOS] plus
[EOS]. Each sample draws from RandomState((random_seed + idx) % 2**32): identical to Megatron's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy
import torch

from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.core.datasets.masked_dataset import (
    MaskedWordPieceDataset,
    MaskedWordPieceDatasetConfig,
)
from gigatron.core.datasets.utils import Split


@dataclass
class T5MaskedWordPieceDatasetConfig(MaskedWordPieceDatasetConfig):
    """Config of T5MaskedWordPieceDataset; the tokenizer needs additional_special_tokens_ids
    (the sentinels), bos and eos."""

    sequence_length_encoder: int | None = field(init=False, default=None)
    """Alias of sequence_length: the encoder sequence length."""

    sequence_length_decoder: int = None
    """The decoder sequence length."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sequence_length_encoder = self.sequence_length
        if self.sequence_length_decoder is None:
            raise ValueError("sequence_length_decoder (None) must be set")
        if not len(self.tokenizer.additional_special_tokens_ids) > 0:
            raise ValueError("the tokenizer needs additional_special_tokens_ids (sentinels)")


class T5MaskedWordPieceDataset(MaskedWordPieceDataset):
    """Samples {text_enc [se], text_dec [sd], labels [sd], loss_mask [sd], truncated,
    enc_mask [se], dec_mask [sd]} (int64 arrays; masks 1 = token)."""

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str,
        indexed_indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: T5MaskedWordPieceDatasetConfig,
    ) -> None:
        super().__init__(
            indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config
        )
        self.token_lookup = list(self.config.tokenizer.inv_vocab.keys())
        self.sample_index = self._build_sample_index(self.config.sequence_length - 2, 1)

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return MaskedWordPieceDataset._key_config_attributes() + ["sequence_length_decoder"]

    @staticmethod
    def _build_b1ss_attention_mask(source_block, target_block, make_history_mask=False):
        """[b, sq] query tokens, [b, sk] key tokens -> bool [b, 1, sq, sk], True = masked (a pad
        (< 1) on either side, or a future key with make_history_mask)."""
        mask = (target_block[:, None, :] >= 1) & (source_block[:, :, None] >= 1)  # [b, sq, sk]
        if make_history_mask:
            sq = source_block.shape[1]
            mask = mask & torch.ones(sq, sq, dtype=torch.bool, device=mask.device).tril()
        return (~mask).unsqueeze(1)

    @staticmethod
    def config_attention_mask(encoder_tokens, decoder_tokens, encoder_mask, decoder_mask,
                              use_local: bool = True, test_te_version=None):  # fmt: skip
        """(encoder, decoder, encoder-decoder) masks for the local layers: [b, 1, s, s] each.
        gigatron has no Transformer Engine: use_local=False raises."""
        if not use_local:
            raise ValueError("use_local (False): gigatron has no Transformer Engine masks")
        build = T5MaskedWordPieceDataset._build_b1ss_attention_mask
        return (
            build(encoder_tokens, encoder_tokens),
            build(decoder_tokens, decoder_tokens, make_history_mask=True),
            build(decoder_tokens, encoder_tokens),
        )

    def __getitem__(self, idx: int) -> dict:
        idx_beg, idx_end, target_sequence_length = self.sample_index[idx]
        sample = [self.dataset[i] for i in range(idx_beg, idx_end)]
        rng = numpy.random.RandomState(seed=(self.config.random_seed + idx) % 2**32)
        tok, pad = self.config.tokenizer, self._pad_token_id
        tokens = [t for sentence in sample for t in sentence]
        truncated = len(tokens) > target_sequence_length
        tokens = tokens[:target_sequence_length]
        tokens, _, _, _, masked_spans = self._create_masked_lm_predictions(
            tokens, target_sequence_length, rng
        )
        sentinels = deque(tok.additional_special_tokens_ids)
        encoder_input, decoder_input, decoder_output = [], [tok.bos], []
        start = 0
        for indices, labels in masked_spans:
            sentinel = sentinels.popleft()
            encoder_input.extend(tokens[start : indices[0]])
            encoder_input.append(sentinel)
            decoder_input += [sentinel, *labels]
            decoder_output += [sentinel, *labels]
            start = indices[-1] + 1
        encoder_input.extend(tokens[start:])
        decoder_output.append(tok.eos)

        se, sd = self.config.sequence_length_encoder, self.config.sequence_length_decoder
        num_dec = len(decoder_input)
        if len(encoder_input) > se or num_dec > sd:
            raise ValueError(
                f"sample needs {len(encoder_input)} encoder / {num_dec} decoder tokens > "
                f"sequence_length ({se}) / sequence_length_decoder ({sd})"
            )

        def padded(values, length, value):
            values = numpy.array(values, dtype=numpy.int64)
            return numpy.pad(values, (0, length - len(values)), constant_values=value)

        encoder_input = padded(encoder_input, se, pad)
        decoder_input = padded(decoder_input, sd, pad)
        enc_mask = (encoder_input != pad).astype(numpy.int64)
        dec_mask = (decoder_input != pad).astype(numpy.int64)
        decoder_output = padded(decoder_output, sd, -1)
        loss_mask = numpy.zeros(sd, dtype=numpy.int64)
        loss_mask[:num_dec] = 1
        encoder_input[encoder_input == pad] = 0
        decoder_input[decoder_input == pad] = 0
        decoder_output[decoder_output == pad] = 0
        return {
            "text_enc": encoder_input,
            "text_dec": decoder_input,
            "labels": decoder_output,
            "loss_mask": loss_mask,
            "truncated": int(truncated),
            "enc_mask": enc_mask,
            "dec_mask": dec_mask,
        }

    def _get_token_mask(self, numpy_random_state: numpy.random.RandomState) -> int:
        """Every masked token becomes [MASK] (the spans are then replaced by sentinels)."""
        return self.config.tokenizer.mask
