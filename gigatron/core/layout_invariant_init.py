"""Layout-invariant weight initialisation (a gigatron addition; Megatron has no equivalent).

Megatron seeds each pipeline stage differently (seed + 100·pp_rank), so the same seed gives a
different model at PP = 1 and PP = 2. When a base seed is registered here (the training loop
does it) and `use_cpu_initialization=True`, every component draws its initial weights from a
CPU generator seeded by (base seed, component name): the embedding, each global layer number,
the output layer. Together with CPU initialisation's TP invariance, any TP × PP × VPP layout
then starts from exactly the same full model as one process — which is what makes layouts
comparable step by step against a single-rank run.
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager

import torch

_BASE_SEED: int | None = None


def set_layout_invariant_init_seed(seed: int | None) -> None:
    """Register (or clear, with None) the base seed used by `init_rng_scope`."""
    global _BASE_SEED
    _BASE_SEED = seed


def get_layout_invariant_init_seed() -> int | None:
    return _BASE_SEED


@contextmanager
def init_rng_scope(config, component: str):
    """Build `component` with the CPU generator seeded from (base seed, component).

    No-op unless a base seed is registered and `config.use_cpu_initialization` is True. The
    global CPU generator state is restored afterwards, so the rest of the program's random
    stream is unaffected.
    """
    if _BASE_SEED is None or not getattr(config, "use_cpu_initialization", False):
        yield
        return
    seed = zlib.crc32(f"{_BASE_SEED}:{component}".encode()) & 0x7FFFFFFF
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
