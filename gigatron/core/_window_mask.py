"""The sliding-window attention rule, in one place for every attention path.

`gigatron.core.transformer.utils` re-exports it (with Megatron's `get_sliding_window_causal_mask`
and `is_layer_window_attention`); it lives on core's bottom floor so the fused-softmax shim below
the transformer uses the same rule. Imports nothing from gigatron.
"""

from __future__ import annotations

import torch


def sliding_window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window_size) -> torch.Tensor:
    """Bool [sq, sk], True where key position k_pos[j] lies outside query q_pos[i]'s window.

    window_size = (left, right), Megatron's / Transformer Engine's convention: a query at
    position p sees keys p - left .. p + right; -1 on a side means unbounded there. (W, 0) is
    causal with W keys back, W + 1 keys in all (Hugging Face's `sliding_window` W' is
    (W' - 1, 0)). q_pos [sq], k_pos [sk]: integer positions (global ones under context
    parallelism, positions inside the document for packed sequences). OR it with a causal or
    padding mask.
    """
    left, right = window_size
    back = q_pos.reshape(-1, 1) - k_pos.reshape(1, -1)  # [sq, sk]: how far back each key is
    masked = torch.zeros(back.shape, dtype=torch.bool, device=back.device)
    if left >= 0:
        masked |= back > left
    if right >= 0:
        masked |= back < -right
    return masked


def get_sliding_window_causal_mask(sq: int, skv: int, window_size, device=None) -> torch.Tensor:
    """Bool [sq, skv] (True = masked): `sliding_window_mask` with the queries aligned to the last
    sq keys (query i at position skv - sq + i: a KV cache, or the whole sequence when sq = skv).
    Megatron's function of this name; here -1 means an unbounded side, as in Transformer Engine."""
    q_pos = torch.arange(skv - sq, skv, device=device)
    return sliding_window_mask(q_pos, torch.arange(skv, device=device), window_size)
