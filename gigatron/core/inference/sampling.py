"""Next-token sampling from last-position logits: greedy, temperature, top-k, top-p.

Mirrors `TextGenerationController.sample_from_logits` of `megatron.core.inference` (torch path):
top_k == 1 is argmax; otherwise logits / temperature, then top-k or top-p filtering (-inf
outside the kept set), softmax, one multinomial draw. Top-p keeps the smallest set of most
likely tokens whose probabilities sum to >= p (Megatron's shifted-cumsum rule; the two differ
only when a prefix sums to exactly p, where Megatron also keeps the next token).

Shapes: b: batch rows, V: vocabulary (full, gathered over TP).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["modify_logits_for_top_k_filtering", "modify_logits_for_top_p_filtering", "sample"]


def modify_logits_for_top_k_filtering(logits: Tensor, top_k: int) -> Tensor:
    """logits [b, V] -> same, -inf below the k-th largest value of each row (ties kept)."""
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [b, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def modify_logits_for_top_p_filtering(logits: Tensor, top_p: float) -> Tensor:
    """logits [b, V] -> same, -inf outside the smallest top set with cumulative prob >= top_p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [b, V]
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    before = cum - sorted_logits.softmax(dim=-1)  # mass of the strictly more likely tokens
    drop_sorted = before >= top_p  # the kept prefix already reaches p without this token
    drop_sorted[..., 0] = False  # always keep the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 0.0,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits [b, V] (any float dtype) -> token ids [b] (int64).

    `vocab_size`: ids >= it (vocabulary padding) are never picked. `generator` makes the draw
    reproducible (greedy needs none).
    """
    logits = logits.float()
    if vocab_size is not None and vocab_size < logits.shape[-1]:
        logits = logits.clone()
        logits[..., vocab_size:] = float("-inf")
    if top_k == 1:
        return torch.argmax(logits, dim=-1)
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 1:
        limit = logits.shape[-1] if vocab_size is None else min(vocab_size, logits.shape[-1])
        if top_k > limit:
            raise ValueError(f"top_k ({top_k}) is larger than the vocabulary ({limit})")
        logits = modify_logits_for_top_k_filtering(logits, top_k)
    elif top_p > 0.0:
        logits = modify_logits_for_top_p_filtering(logits, top_p)
    probs = logits.softmax(dim=-1)  # [b, V]
    return torch.multinomial(probs, num_samples=1, generator=generator).view(-1)
