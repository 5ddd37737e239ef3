"""Memory housekeeping of the training loop: manual Python GC and CUDA cache emptying.

Mirrors the `--manual-gc*` and `--empty-unused-memory-level` handling of
`megatron.training.training`. Used by `gigatron.training.training`.
"""

from __future__ import annotations

import gc

import torch


class ManualGC:
    """`--manual-gc`: Python's automatic collector off for the run, `gc.collect()` at the start,
    every `--manual-gc-interval` iterations (0: never between steps) and around each
    evaluation unless `--no-manual-gc-eval`. Aligning collections across ranks avoids one rank
    pausing while the others wait in a collective. `close()` restores the collector."""

    def __init__(self, args) -> None:
        self.enabled = bool(getattr(args, "manual_gc", False))
        self.interval = int(getattr(args, "manual_gc_interval", 0) or 0)
        self.around_eval = bool(getattr(args, "manual_gc_eval", True))
        self.collections = 0
        self._was_enabled = gc.isenabled()
        if self.enabled:
            gc.disable()
            self._collect()

    def _collect(self) -> None:
        gc.collect()
        self.collections += 1

    def after_step(self, iteration: int) -> None:
        if self.enabled and self.interval and iteration % self.interval == 0:
            self._collect()

    def around_evaluation(self) -> None:
        if self.enabled and self.around_eval:
            self._collect()

    def close(self) -> None:
        if self.enabled and self._was_enabled:
            gc.enable()


def empty_unused_memory(args, level: int) -> None:
    """`--empty-unused-memory-level`: release cached CUDA blocks (Megatron: level >= 1 after each
    step's forward/backward and after evaluation, level 2 also after the optimizer step)."""
    if getattr(args, "empty_unused_memory_level", 0) >= level and torch.cuda.is_available():
        torch.cuda.empty_cache()
