"""Small shared pieces of the datasets package: the Split enum, weight normalisation, blends.

Mirrors `megatron.core.datasets.utils`. `compile_helpers` is a no-op kept for scripts that call
it: gigatron's index builders are NumPy (see `helpers.py`), there is no C++ extension to build.
"""

from __future__ import annotations

import logging
from enum import Enum

import numpy
import torch

logger = logging.getLogger(__name__)


def compile_helpers() -> None:
    """No-op: Megatron builds its C++ dataset helpers here; gigatron's are NumPy (helpers.py)."""


class Split(Enum):
    train = 0
    valid = 1
    test = 2


def log_single_rank(logger: logging.Logger, *args, rank: int = 0, **kwargs) -> None:
    """Log only on `rank` (or always when torch.distributed is not initialised)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_rank() != rank:
            return
    logger.log(*args, **kwargs)


def normalize(weights: list[float]) -> list[float]:
    """Divide by the sum (float64, like Megatron); negative, infinite, NaN or zero-sum weights
    are an error (Megatron divides by an infinite sum and blends NaN)."""
    w = numpy.array(weights, dtype=numpy.float64)
    if not numpy.isfinite(w).all():
        raise ValueError(f"blend weights {list(weights)} must be finite numbers")
    if (w < 0).any():
        raise ValueError(f"blend weights {list(weights)} must be non-negative")
    total = numpy.sum(w)
    if not total > 0:
        raise ValueError(f"blend weights {list(weights)} must sum to a positive number")
    return (w / total).tolist()


def get_blend_from_list(blend: list[str] | None) -> tuple[list[str], list[float] | None] | None:
    """`["30", "a", "70", "b"]` -> `(["a", "b"], [30.0, 70.0])`; prefixes only -> weights None.

    An odd-length list, or an even one whose weight slots are not numbers, is prefixes only.
    """
    if blend is None:
        return None
    if len(blend) % 2 == 1:
        weights, prefixes = None, list(blend)
    else:
        raw_weights = blend[0::2]
        weights = []
        for raw in raw_weights:
            try:
                weights.append(float(raw))
            except ValueError:
                weights.append(None)
        if any(w is None for w in weights):
            if not all(w is None for w in weights):
                raise ValueError(
                    f"blend list {blend} mixes numeric and non-numeric weights; give either "
                    "'w1 prefix1 w2 prefix2 ...' or prefixes only"
                )
            weights, prefixes = None, list(blend)
        else:
            prefixes = list(blend[1::2])
    return [p.strip() for p in prefixes], weights
