"""Small inference helpers (mirrors `megatron.core.inference.utils`): the inference-active flag,
request-id counter, causal mask and index swap. The dynamic engine's MoE / CUDA-graph / flashinfer
helpers have no counterpart (gigatron has no dynamic-batching engine)."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["Counter", "InferenceMode", "get_attention_mask", "tensor_swap"]


class InferenceMode:
    """Process-wide flag: True while an inference engine uses the model (`gigatron generate`
    sets it). Read `InferenceMode.is_active()` rather than `self.training`."""

    _is_active: bool = False

    @classmethod
    def is_active(cls) -> bool:
        return cls._is_active

    @classmethod
    def set_active(cls) -> None:
        cls._is_active = True

    @classmethod
    def unset_active(cls) -> None:
        cls._is_active = False

    @classmethod
    @contextlib.contextmanager
    def active(cls):
        """Set the flag for the duration of the `with` block."""
        cls.set_active()
        try:
            yield
        finally:
            cls.unset_active()


class Counter:
    """Request ids: `next(counter)` returns start, start + 1, ..."""

    def __init__(self, start: int = 0) -> None:
        self.counter = start

    def __next__(self) -> int:
        i = self.counter
        self.counter += 1
        return i

    def reset(self) -> None:
        self.counter = 0


def get_attention_mask(seq_length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[1, 1, s, s] bool, True where attention is masked (key after query), Megatron's
    convention. `device` defaults to the current CUDA device, or the CPU without CUDA."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    ones = torch.ones((1, seq_length, seq_length), device=device)
    return torch.tril(ones).view(1, 1, seq_length, seq_length) < 0.5


def tensor_swap(x: torch.Tensor, src_idxs, dst_idxs) -> None:
    """Swap x[src_idxs] and x[dst_idxs] in place."""
    x[dst_idxs], x[src_idxs] = x[src_idxs], x[dst_idxs]
