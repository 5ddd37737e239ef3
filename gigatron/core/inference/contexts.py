"""Inference contexts: the per-generation state handed to the model (static KV cache).

Mirrors `megatron.core.inference.contexts` (BaseInferenceContext, StaticInferenceContext). The
static context holds, per attention layer (keyed by `layer_number`), a key and a value buffer
`[max_sequence_length, max_batch_size, ng, hn]` (Megatron's layout); `sequence_len_offset` is
how many positions are already cached and `batch_size_offset` the first batch row of the
current forward. The caller advances `sequence_len_offset` after each forward
(`increment_sequence_len_offset`), as Megatron's generation controller does.

gigatron differences: keys are cached after RoPE (Megatron does so on its flash-decode path),
and a chunk of several new tokens after the prompt attends causally to the cache (Megatron's
static path turns masking off once `sequence_len_offset > 0`, which is only right for one token).

Shapes: s: new tokens, sk: cached + new, b: batch rows, ng: K/V heads on this rank, hn: head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BaseInferenceContext", "StaticInferenceContext"]


class BaseInferenceContext:
    """What every inference context offers (Megatron's abstract base)."""

    def __init__(self, materialize_only_last_token_logits: bool):
        # True: GPTModel computes logits for the last position only (all a sampler needs).
        self.materialize_only_last_token_logits = materialize_only_last_token_logits

    def is_static_batching(self) -> bool:
        raise NotImplementedError

    def is_dynamic_batching(self) -> bool:
        return not self.is_static_batching()

    def increment_sequence_len_offset(self, increment: int) -> None:
        """Count `increment` more cached positions (no-op for dynamic batching)."""
        if self.is_static_batching():
            self.sequence_len_offset += increment

    def increment_batch_size_offset(self, increment: int) -> None:
        if self.is_static_batching():
            self.batch_size_offset += increment

    def reset_batch_size_offset(self) -> None:
        if self.is_static_batching():
            self.batch_size_offset = 0


class StaticInferenceContext(BaseInferenceContext):
    """Fixed-size KV cache for `max_batch_size` rows of up to `max_sequence_length` positions."""

    def __init__(
        self, max_batch_size: int, max_sequence_length: int, use_flashinfer_fused_rope=None
    ):
        super().__init__(materialize_only_last_token_logits=True)
        if max_batch_size < 1 or max_sequence_length < 1:
            raise ValueError(
                f"max_batch_size ({max_batch_size}) and max_sequence_length "
                f"({max_sequence_length}) must be >= 1"
            )
        if use_flashinfer_fused_rope:
            raise ValueError("use_flashinfer_fused_rope (True) is not supported by gigatron")
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        # {layer_number: (key [max_s, max_b, ng, hn], value [max_s, max_b, ng, hn])}
        self.key_value_memory_dict: dict[int, tuple[Tensor, Tensor]] = {}
        self.decode_mode = False

    def is_static_batching(self) -> bool:
        return True

    def enable_prefill_mode(self) -> None:
        self.decode_mode = False

    def enable_decode_mode(self) -> None:
        self.decode_mode = True

    def is_decode_only(self) -> bool:
        return self.decode_mode

    def reset(self) -> None:
        """Start a new batch: offsets to 0 (the buffers are reused and overwritten)."""
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        self.enable_prefill_mode()

    def swap_key_value_dict(self, batch_idx) -> None:
        """Reorder the cached batch rows (beam search bookkeeping, as in Megatron)."""
        if not self.key_value_memory_dict:
            raise ValueError("swap_key_value_dict: the KV cache is empty")
        for layer, (k, v) in self.key_value_memory_dict.items():
            if len(batch_idx) != k.shape[1]:
                raise ValueError(
                    f"batch_idx has {len(batch_idx)} entries; the cache holds {k.shape[1]} rows"
                )
            self.key_value_memory_dict[layer] = (k[:, batch_idx], v[:, batch_idx])

    def append_key_value(self, layer_number: int, key: Tensor, value: Tensor):
        """Write new key/value [s, b, ng, hn] at the current offsets; return all cached keys
        and values of these rows, [sk, b, ng, hn] with sk = sequence_len_offset + s."""
        s, b = key.shape[0], key.shape[1]
        start, row = self.sequence_len_offset, self.batch_size_offset
        if start + s > self.max_sequence_length or row + b > self.max_batch_size:
            raise ValueError(
                f"KV cache overflow: positions {start}+{s} > max_sequence_length "
                f"({self.max_sequence_length}) or rows {row}+{b} > max_batch_size "
                f"({self.max_batch_size})"
            )
        if layer_number not in self.key_value_memory_dict:
            shape = (self.max_sequence_length, self.max_batch_size, *key.shape[2:])
            self.key_value_memory_dict[layer_number] = (
                torch.empty(shape, dtype=key.dtype, device=key.device),
                torch.empty((*shape[:3], value.shape[3]), dtype=value.dtype, device=value.device),
            )
        key_memory, value_memory = self.key_value_memory_dict[layer_number]
        key_memory[start : start + s, row : row + b] = key
        value_memory[start : start + s, row : row + b] = value
        return key_memory[: start + s, row : row + b], value_memory[: start + s, row : row + b]

    def __str__(self) -> str:
        return (
            f"StaticInferenceContext(max_seq_len={self.max_sequence_length}, "
            f"max_batch_size={self.max_batch_size}, sequence_len_offset="
            f"{self.sequence_len_offset}, batch_size_offset={self.batch_size_offset}, "
            f"layers={sorted(self.key_value_memory_dict)}, decode_mode={self.decode_mode})"
        )
