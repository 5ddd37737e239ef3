"""AutoBridge: Megatron-Bridge's Python entry point for HF <-> gigatron, on CPU and offline.

Mirrors `megatron.bridge.AutoBridge` (NVIDIA-NeMo/Megatron-Bridge) as users call it, and is
reachable as `from megatron.bridge import AutoBridge` through gigatron's alias
(`gigatron.compat.megatron`). The family adapters (`gigatron.convert.families`) do the work:

    bridge = AutoBridge.from_hf_pretrained("/path/to/hf_dir")      # a local directory
    provider = bridge.to_megatron_provider(load_weights=True)       # GPTModelProvider
    provider.tensor_model_parallel_size = 2
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False)  # [GPTModel chunks]
    bridge.save_hf_pretrained(model, "/path/to/out")                 # config, tokenizer, weights
    for name, tensor in bridge.export_hf_weights(model): ...         # streamed, every rank
    bridge.export_ckpt("/path/to/torch_dist_ckpt", "/path/to/out")   # no model built

Differences from Megatron-Bridge: paths are local directories (no hub download, no
`trust_remote_code` models); a family is chosen by config.json's `model_type` (Megatron-Bridge:
`architectures`); `export_hf_weights` yields on every rank (gathered over the whole world, see
`_model_export`); `save_hf_weights` / `save_hf_pretrained` take `max_shard_bytes`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

from gigatron.convert import _model_export as mx
from gigatron.convert.families import FAMILIES
from gigatron.convert.gigatron_to_hf import check_complete, convert_gigatron_to_hf
from gigatron.convert.gpt_provider import GPTModelProvider
from gigatron.convert.hf_config import (
    HFModelSpec,
    is_hf_dir,
    parse_config_json,
    read_hf_config,
    spec_from_hf_config,
)
from gigatron.convert.hf_io import write_safetensors
from gigatron.convert.hf_to_gigatron import (
    convert_hf_to_gigatron,
    copy_side_files,
    load_hf_into_model,
)
from gigatron.core import parallel_state as ps

__all__ = ["AutoBridge", "GPTModelProvider"]

_DEFAULT_SHARD_BYTES = 5 * 1024**3


def _config_dict(config) -> dict:
    """A transformers PretrainedConfig (its `to_dict()`) or a config.json dict."""
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise ValueError(
        f"config ({type(config).__name__}) must be a transformers PretrainedConfig or a dict"
    )


def _chunks(model) -> list:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class AutoBridge:
    """One HF model (its config, and its weights' directory when there is one)."""

    def __init__(self, hf_config: dict, hf_path: str | None = None):
        self.hf_config = hf_config
        self.hf_path = hf_path
        self._spec: HFModelSpec = spec_from_hf_config(hf_config)

    # --------------------------------------------------------------- creation
    @classmethod
    def from_hf_pretrained(cls, path: str | os.PathLike, **kwargs) -> AutoBridge:
        """A bridge for the HF model saved in local directory `path` (config.json + safetensors;
        its sizes checked against the tensors' headers)."""
        if kwargs:
            raise ValueError(
                f"AutoBridge.from_hf_pretrained: {sorted(kwargs)} not supported (gigatron reads "
                "a local safetensors directory as saved; no hub, dtype or remote-code options)"
            )
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"AutoBridge.from_hf_pretrained: {path!r} is not a local directory")
        return cls(read_hf_config(path), path)

    @classmethod
    def from_hf_config(cls, config) -> AutoBridge:
        """A bridge from a config alone (a PretrainedConfig or a config.json dict): build
        models, export them, export checkpoints; no HF weights to load."""
        return cls(_config_dict(config))

    @classmethod
    def supports(cls, config) -> bool:
        """True when the config's `model_type` has a family adapter."""
        return _config_dict(config).get("model_type") in FAMILIES

    @classmethod
    def can_handle(cls, path: str | os.PathLike, trust_remote_code: bool = False) -> bool:
        """True for a local HF directory whose config.json names a supported family."""
        path = os.fspath(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            return False
        return cls.supports(parse_config_json(os.path.join(path, "config.json")))

    @classmethod
    def list_supported_models(cls) -> list[str]:
        """The transformers causal-LM classes with a family adapter (sorted)."""
        return sorted({f.hf_class for f in FAMILIES.values()})

    @property
    def transformer_config(self):
        """The TransformerConfig of this model (TP = PP = 1)."""
        return self._spec.transformer_config()

    # ---------------------------------------------------------- HF -> gigatron
    def to_megatron_provider(
        self, load_weights: bool = True, hf_path: str | os.PathLike | None = None
    ) -> GPTModelProvider:
        """A provider of this model; with `load_weights` its models are filled from the HF
        directory (streaming, `load_hf_into_model`) before DDP wraps them."""
        provider = GPTModelProvider(self._spec)
        if load_weights:
            path = self._weights_dir(hf_path)
            provider.register_pre_wrap_hook(lambda chunks: self.load_hf_weights(chunks, path))
        return provider

    def to_megatron_model(
        self, load_weights: bool = True, hf_path: str | os.PathLike | None = None, **kwargs
    ) -> list:
        """`to_megatron_provider(...).provide_distributed_model(**kwargs)` at the current
        parallel_state layout (TP1 / PP1 when none is initialised)."""
        provider = self.to_megatron_provider(load_weights, hf_path)
        if ps.model_parallel_is_initialized():
            provider.tensor_model_parallel_size = ps.get_tensor_model_parallel_world_size()
            provider.pipeline_model_parallel_size = ps.get_pipeline_model_parallel_world_size()
            provider.expert_model_parallel_size = ps.get_expert_model_parallel_world_size()
            provider.context_parallel_size = ps.get_context_parallel_world_size()
        provider.finalize()
        return provider.provide_distributed_model(**kwargs)

    def load_hf_weights(self, model, hf_path: str | os.PathLike | None = None) -> list:
        """Fill built model chunks (any layout) from the HF safetensors, streaming."""
        load_hf_into_model(_chunks(model), self._weights_dir(hf_path))
        return _chunks(model)

    @classmethod
    def import_ckpt(
        cls, hf_model_id: str | os.PathLike, megatron_path: str | os.PathLike, **kwargs
    ) -> None:
        """HF directory -> a torch_dist training checkpoint (`convert_hf_to_gigatron`; kwargs:
        its layout sizes), in this one process."""
        convert_hf_to_gigatron(os.fspath(hf_model_id), os.fspath(megatron_path), **kwargs)

    # ---------------------------------------------------------- gigatron -> HF
    def export_hf_weights(self, model, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) for every HF tensor, in the family's order, streamed one
        recipe at a time. Collective: every rank must iterate to the end. `cpu=False` moves
        each tensor to the model's device."""
        chunks = [mx.unwrap(c) for c in _chunks(model)]
        shapes = mx.global_shapes(chunks)
        recipes = self._recipes(shapes)
        device = next(chunks[0].parameters()).device
        for name, tensor in mx.iter_hf_tensors(chunks, recipes, shapes):
            yield name, tensor if cpu else tensor.to(device)

    def save_hf_weights(
        self,
        model,
        path: str | os.PathLike,
        show_progress: bool = True,
        *,
        max_shard_bytes: int = _DEFAULT_SHARD_BYTES,
    ) -> list[str]:
        """Write the weights as HF does (`model.safetensors`, or shards + index once over
        `max_shard_bytes`); every rank streams, rank 0 writes. Returns the file names."""
        path = os.fspath(path)
        chunks = [mx.unwrap(c) for c in _chunks(model)]
        shapes = mx.global_shapes(chunks)
        recipes = self._recipes(shapes)
        tensors = mx.iter_hf_tensors(chunks, recipes, shapes)
        files: list[str] = []
        if _rank() == 0:
            os.makedirs(path, exist_ok=True)
            plan = mx.hf_plan(recipes, shapes)
            files = write_safetensors(path, plan, tensors, max_shard_bytes=max_shard_bytes)
            if show_progress:
                size = sum(torch.Size(s).numel() * t.itemsize for _, s, t in plan)
                print(f"saved {len(plan)} tensors ({size / 1e6:.1f} MB) in {len(files)} file(s) "
                      f"to {path}", file=sys.stderr)  # fmt: skip
        else:
            for _ in tensors:
                pass
        if dist.is_initialized():
            dist.barrier()
        return files

    def save_hf_pretrained(
        self,
        model,
        path: str | os.PathLike,
        show_progress: bool = True,
        *,
        max_shard_bytes: int = _DEFAULT_SHARD_BYTES,
    ) -> None:
        """A HF directory transformers loads: config.json, the tokenizer / generation files of
        the source directory, and the weights (`save_hf_weights`)."""
        path = os.fspath(path)
        if _rank() == 0:
            self._write_side_files(path)
        self.save_hf_weights(model, path, show_progress, max_shard_bytes=max_shard_bytes)

    def export_ckpt(
        self,
        megatron_path: str | os.PathLike,
        hf_path: str | os.PathLike,
        show_progress: bool = True,
        *,
        max_shard_bytes: int = _DEFAULT_SHARD_BYTES,
    ) -> None:
        """A torch_dist checkpoint (any layout it was saved at) -> HF directory, reading the
        checkpoint's tensors one at a time from its metadata; no model is built. Bitwise what
        building the model and `save_hf_pretrained` give."""
        hf_path = os.fspath(hf_path)
        files = convert_gigatron_to_hf(
            os.fspath(megatron_path), hf_path, hf_config=self.hf_config,
            max_shard_bytes=max_shard_bytes,
        )  # fmt: skip
        self._write_side_files(hf_path)
        if show_progress:
            print(f"exported {megatron_path} to {hf_path} ({len(files)} file(s))", file=sys.stderr)

    # ---------------------------------------------------------------- helpers
    def _weights_dir(self, hf_path) -> str:
        path = os.fspath(hf_path) if hf_path is not None else self.hf_path
        if path is None or not is_hf_dir(path):
            raise ValueError(
                f"load_weights needs a HF directory with safetensors (hf_path {path!r}); a "
                "bridge from_hf_config has none: pass hf_path or load_weights=False"
            )
        return path

    def _recipes(self, shapes: dict) -> list:
        recipes = mx.plan_recipes(self._spec, shapes)
        check_complete(self._spec, recipes, shapes)
        return recipes

    def _write_side_files(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        if self.hf_path is not None:
            copy_side_files(self.hf_path, path)
        else:
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(self.hf_config, f, indent=2, sort_keys=True)
