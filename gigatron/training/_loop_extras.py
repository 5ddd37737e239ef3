"""Training-loop pieces behind Megatron flags: manual GC, cache emptying, extra
TensorBoard scalars, the --moe-layer-freq check of the built model.

Mirrors the `--manual-gc*`,
`--empty-unused-memory-level` and `--log-*-to-tensorboard` handling of
`megatron.training.training`. Used by `gigatron.training.training`.
"""

from __future__ import annotations

import gc
import math

import torch

from gigatron.core.transformer.moe.moe_layer import MoELayer
from gigatron.core.transformer.transformer_layer import TransformerLayer


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


def write_extra_scalars(args, writer, iteration: int, stats: dict) -> None:
    """The TensorBoard scalars Megatron writes beyond gigatron's log line set: loss scale (on by
    default; `--no-log-loss-scale-to-tensorboard`), world size and memory. (The params norm is
    written with the losses: the loop shows it after them.)"""
    if writer is None:
        return
    if stats.get("loss_scale") is not None and getattr(args, "log_loss_scale_to_tensorboard", 1):
        writer.add_scalar("loss-scale", stats["loss_scale"], iteration)
    if getattr(args, "log_world_size_to_tensorboard", False):
        writer.add_scalar("world-size", args.world_size, iteration)
    if getattr(args, "log_memory_to_tensorboard", False):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            writer.add_scalar("mem-allocated-bytes", torch.cuda.memory_allocated(), iteration)
            writer.add_scalar(
                "mem-max-allocated-bytes", torch.cuda.max_memory_allocated(), iteration
            )
            writer.add_scalar("mem-reserved-bytes", torch.cuda.memory_reserved(), iteration)
        else:
            import resource

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB -> bytes
            writer.add_scalar("mem-max-rss-bytes", rss, iteration)


def write_validation_ppl(args, writer, iteration: int, losses: dict) -> None:
    """`--log-validation-ppl-to-tensorboard`: exp(loss) per validation loss (Megatron clips the
    exponent at 20, as the log line does)."""
    if writer is None or not getattr(args, "log_validation_ppl_to_tensorboard", False):
        return
    for key, value in losses.items():
        writer.add_scalar(f"{key} validation ppl", math.exp(min(20.0, value)), iteration)


def check_moe_layer_pattern(chunks, config) -> None:
    """--moe-layer-freq: the built layers must follow the config's MoE pattern. A provider that
    builds every layer from one layer spec ignores the pattern (pretrain_gpt's did: MoE in
    every layer under --moe-layer-freq 2, a silently different model)."""
    if config is None or not config.num_moe_experts or config.moe_layer_freq == 1:
        return
    from gigatron.core.transformer.moe.moe_utils import get_moe_layer_pattern

    pattern = get_moe_layer_pattern(config)
    for chunk in chunks:
        for name, layer in chunk.named_modules():
            # the MTP block's layers follow their own spec (Megatron's MTP copies the last layer)
            if not isinstance(layer, TransformerLayer) or "mtp." in f".{name}":
                continue
            i = layer.layer_number - 1
            if isinstance(layer.mlp, MoELayer) != bool(pattern[i]):
                raise ValueError(
                    f"--moe-layer-freq {config.moe_layer_freq}: layer {i} was built "
                    f"{'with' if pattern[i] == 0 else 'without'} experts against the pattern "
                    f"{pattern}; the model provider must build the decoder from "
                    "get_gpt_decoder_block_spec(config, ...)"
                )
