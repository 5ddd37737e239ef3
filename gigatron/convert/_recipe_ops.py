"""The tensor recipes' building blocks: Recipe and the plain per-tensor transforms.

Shared by the family recipe modules (_recipes.py, _deepseek_recipes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Recipe:
    key: str
    hf_keys: tuple[str, ...]
    to_gig: Callable[..., Tensor]
    to_hf: Callable[[Tensor], tuple[Tensor, ...]]


def _same(key: str, hf_key: str) -> Recipe:
    return Recipe(key, (hf_key,), lambda t: t, lambda t: (t,))


def _transposed(key: str, hf_key: str) -> Recipe:  # GPT-2 Conv1D [in, out] <-> Linear [out, in]
    return Recipe(key, (hf_key,), lambda t: t.t().contiguous(), lambda t: (t.t().contiguous(),))


def _vocab(key: str, hf_key: str, vocab: int, padded: int) -> Recipe:
    """Vocabulary rows [v, h] <-> [padded, h] (zero rows appended, dropped on export)."""

    def to_gig(t):
        return F.pad(t, (0, 0, 0, padded - t.shape[0])) if padded > t.shape[0] else t

    return Recipe(key, (hf_key,), to_gig, lambda t: (t[:vocab].contiguous(),))


def _glu(key: str, gate: str, up: str) -> Recipe:
    return Recipe(
        key,
        (gate, up),
        lambda g, u: torch.cat([g, u], dim=0),
        lambda t: tuple(x.contiguous() for x in t.chunk(2, dim=0)),
    )
