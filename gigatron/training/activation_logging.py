"""Capture forward activations (and MoE tokens-per-expert counts) with forward hooks.

Mirrors `megatron.training.activation_logging`. Activation hooks sit on every linear-like
module (`nn.Linear`, `nn.Embedding`, Column/RowParallelLinear, the MoE Router) and record
inputs, outputs and keyword arguments on CPU; `save_activations` writes them through
`checkpointing.save_grads` under `<save_dir>/activations/`. Tokens-per-expert hooks attach, in
Megatron, to Transformer Engine grouped linears only; gigatron builds none, so
`register_tpe_hooks` finds nothing to hook (Megatron's behaviour without TE), while
`_make_tpe_hook` / `save_tpe` work on any module given to them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn as nn

from gigatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from gigatron.core.transformer.moe.router import Router
from gigatron.core.utils import unwrap_model
from gigatron.training.checkpointing import save_grads

logger = logging.getLogger(__name__)

LINEAR_TYPES = (nn.Linear, nn.Embedding, ColumnParallelLinear, RowParallelLinear, Router)
_GROUPED_LINEAR_TYPES: tuple = ()  # Transformer Engine grouped linears: none in gigatron

_DECODER_FC1 = re.compile(r"decoder\.layers\.(\d+)\.mlp\.experts\.linear_fc1")
_MTP_FC1 = re.compile(
    r"mtp\.layers\.(\d+)\.mtp_model_layer\.layers\.(\d+)\.mlp\.experts\.linear_fc1"
)


def _parse_tpe_module_name(module_name: str) -> tuple[str, int | None, int] | None:
    """`decoder.layers.3.mlp.experts.linear_fc1` -> ("decoder", None, 3);
    `mtp.layers.0.mtp_model_layer.layers.1.mlp.experts.linear_fc1` -> ("mtp", 0, 1); else None."""
    if m := _DECODER_FC1.fullmatch(module_name):
        return "decoder", None, int(m.group(1))
    if m := _MTP_FC1.fullmatch(module_name):
        return "mtp", int(m.group(1)), int(m.group(2))
    return None


def _register_hooks(model, module_types, hook_factory, *, name_filter=None) -> list:
    """A forward hook (with kwargs) from `hook_factory(chunk_name, module_name)` on every
    module of every chunk that is one of `module_types` (and passes `name_filter`)."""
    handles = []
    if not module_types:
        return handles
    for chunk_id, chunk in enumerate(model):
        for name, module in unwrap_model(chunk).named_modules():
            if not isinstance(module, module_types):
                continue
            if name_filter is not None and not name_filter(name):
                continue
            hook = hook_factory(f"model_chunk{chunk_id}", name)
            if hook is not None:
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return handles


def _to_cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


class ActivationLogger:
    """Two independent hook sets: full activations of linear-like modules, and the
    tokens-per-expert list MoE expert layers receive as their second input."""

    def __init__(self, save_dir: str):
        self._save_dir = save_dir
        self._activations_state_dict: defaultdict = defaultdict(dict)
        self._activation_hooks: list = []
        # per-microbatch token counts: decoder keyed by layer, MTP by (mtp_idx, layer)
        self._decoder_tpe_records: dict[int, list[list[int]]] = defaultdict(list)
        self._mtp_tpe_records: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
        self._tpe_hooks: list = []

    def _make_activation_hook(self, model_chunk_name: str, module_name: str) -> Callable:
        """Hook storing `<module>/input<i>`, `<module>/output<i>` and `<module>/<kwarg>`."""
        store = self._activations_state_dict

        def hook(_module, args, kwargs, output):
            for i, value in enumerate(args if isinstance(args, tuple) else (args,)):
                if value is not None:
                    store[model_chunk_name][f"{module_name}/input{i}"] = _to_cpu(value)
            for i, value in enumerate(output if isinstance(output, tuple) else (output,)):
                if isinstance(value, torch.Tensor):
                    store[model_chunk_name][f"{module_name}/output{i}"] = _to_cpu(value)
            for key, value in kwargs.items():
                store[model_chunk_name][f"{module_name}/{key}"] = _to_cpu(value)

        return hook

    def register_activation_hooks(self, model) -> None:
        if self._activation_hooks:
            raise RuntimeError("activation hooks are already registered; remove them first")
        self._activation_hooks = _register_hooks(model, LINEAR_TYPES, self._make_activation_hook)

    def remove_activation_hooks(self) -> None:
        for handle in self._activation_hooks:
            handle.remove()
        self._activation_hooks.clear()

    def save_activations(self, iteration: int) -> None:
        """Write the captured activations (if any) and forget them."""
        if not self._activations_state_dict:
            return
        save_grads(self._save_dir, self._activations_state_dict, iteration, "activations")
        self._activations_state_dict.clear()

    def _make_tpe_hook(self, _model_chunk_name: str, module_name: str) -> Callable | None:
        """Hook recording the non-tensor second input (tokens per expert) of a decoder or MTP
        expert `linear_fc1`; None, with a warning, for a module name of neither form."""
        parsed = _parse_tpe_module_name(module_name)
        if parsed is None:
            logger.warning(
                "Cannot extract layer number from module name: %r; "
                "no tokens-per-expert hook for this module",
                module_name,
            )
            return None
        block, mtp_idx, layer = parsed
        if block == "decoder":
            records, key = self._decoder_tpe_records, layer
        else:
            records, key = self._mtp_tpe_records, (mtp_idx, layer)

        def hook(_module, args, kwargs, output):
            inputs = args if isinstance(args, tuple) else (args,)
            if (
                len(inputs) > 1
                and inputs[1] is not None
                and not isinstance(inputs[1], torch.Tensor)
            ):
                records[key].append(list(inputs[1]))

        return hook

    def register_tpe_hooks(self, model) -> None:
        if self._tpe_hooks:
            raise RuntimeError("tokens-per-expert hooks are already registered")
        self._tpe_hooks = _register_hooks(
            model,
            _GROUPED_LINEAR_TYPES,
            self._make_tpe_hook,
            name_filter=lambda name: name.endswith("linear_fc1"),
        )

    def remove_tpe_hooks(self) -> None:
        for handle in self._tpe_hooks:
            handle.remove()
        self._tpe_hooks.clear()

    def save_tpe(self, iteration: int) -> None:
        """Append one JSON line per layer to `<save_dir>/tokens_per_expert/rank<r>.jsonl`:
        `{"iter", "block": "decoder", "layer", "tpe"}` (MTP lines add "mtp_idx"), sorted by
        layer, decoder first; then forget the records."""
        if not self._decoder_tpe_records and not self._mtp_tpe_records:
            return
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        out_dir = os.path.join(self._save_dir, "tokens_per_expert")
        os.makedirs(out_dir, exist_ok=True)
        lines = [
            {"iter": iteration, "block": "decoder", "layer": layer, "tpe": tpe}
            for layer, tpe in sorted(self._decoder_tpe_records.items())
        ]
        lines += [
            {"iter": iteration, "block": "mtp", "mtp_idx": mtp_idx, "layer": layer, "tpe": tpe}
            for (mtp_idx, layer), tpe in sorted(self._mtp_tpe_records.items())
        ]
        with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        self._decoder_tpe_records.clear()
        self._mtp_tpe_records.clear()


_LOGGER: ActivationLogger | None = None


def _get_logger(save_dir: str) -> ActivationLogger:
    global _LOGGER
    if _LOGGER is None:
        _LOGGER = ActivationLogger(save_dir)
    return _LOGGER


def _require_logger() -> ActivationLogger:
    if _LOGGER is None:
        raise RuntimeError("No ActivationLogger has been initialised; enable logging first")
    return _LOGGER


def enable_activation_logging(model, save_dir: str) -> None:
    _get_logger(save_dir).register_activation_hooks(model)


def disable_activation_logging() -> None:
    _require_logger().remove_activation_hooks()


def save_activations(iteration: int) -> None:
    _require_logger().save_activations(iteration)


def enable_tokens_per_expert_logging(model, save_dir: str) -> None:
    _get_logger(save_dir).register_tpe_hooks(model)


def disable_tokens_per_expert_logging() -> None:
    _require_logger().remove_tpe_hooks()


def save_tokens_per_expert(iteration: int) -> None:
    _require_logger().save_tpe(iteration)
