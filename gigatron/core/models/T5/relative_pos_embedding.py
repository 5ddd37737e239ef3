"""T5's bucketed relative position bias: one learned scalar per (bucket, head), added to the
attention scores of every self-attention layer of a stack.

Mirrors `megatron.core.models.common.embeddings.relative_pos_embedding.RelativePositionEmbedding`
(Megatron adapted the bucketing from Hugging Face's T5;
tests/core/models/T5/test_relative_pos_embedding.py checks it against `transformers`'
T5Attention.compute_bias). Buckets: half exact offsets, half log-spaced up
to max_distance; bidirectional stacks (encoder) split the buckets by sign, causal ones (decoder)
only see the past.

Shapes: sq / sk: query / key length, np: attention heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


class RelativePositionEmbedding(torch.nn.Module):
    """(query_seq_length, key_seq_length) -> bias [1, np, sq, sk]."""

    def __init__(
        self,
        bidirectional: bool,
        init_method: Callable,
        num_attention_heads: int,
        relative_attention_num_buckets: int = 32,
        relative_attention_max_distance: int = 128,
    ) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.relative_attention_bias = torch.nn.Embedding(
            relative_attention_num_buckets, num_attention_heads
        )
        init_method(self.relative_attention_bias.weight)

    @staticmethod
    def _relative_position_bucket(
        relative_position: Tensor,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> Tensor:
        """key position - query position [sq, sk] -> bucket ids in [0, num_buckets)."""
        buckets = torch.zeros_like(relative_position)
        if bidirectional:
            num_buckets //= 2
            buckets += (relative_position > 0).long() * num_buckets
            distance = relative_position.abs()
        else:
            distance = -torch.clamp(relative_position, max=0)
        max_exact = num_buckets // 2
        large = (
            max_exact
            + (
                torch.log(distance.float() / max_exact)
                / math.log(max_distance / max_exact)
                * (num_buckets - max_exact)
            ).long()
        )
        large = torch.clamp(large, max=num_buckets - 1)
        return buckets + torch.where(distance < max_exact, distance, large)

    def forward(self, query_seq_length: int, key_seq_length: int) -> Tensor:
        device = self.relative_attention_bias.weight.device
        query = torch.arange(query_seq_length, dtype=torch.long, device=device)[:, None]
        memory = torch.arange(key_seq_length, dtype=torch.long, device=device)[None, :]
        bucket = self._relative_position_bucket(
            memory - query,
            bidirectional=self.bidirectional,
            num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance,
        )  # [sq, sk]
        values = self.relative_attention_bias(bucket)  # [sq, sk, np]
        return values.permute(2, 0, 1).unsqueeze(0)  # [1, np, sq, sk]
