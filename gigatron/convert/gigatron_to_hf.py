"""gigatron training checkpoint (torch_dist, any layout it was saved at) -> HF safetensors.

No counterpart in megatron.core. Reads the checkpoint one Megatron key at a time (a
dist_checkpointing load of that global tensor), applies the exact inverse of the import recipe
(split QKV / GLU, transpose GPT-2 Conv1D weights, drop padded vocabulary rows) and streams the
HF tensors into safetensors files whose headers were planned from the checkpoint metadata, so
peak memory is about one tensor. Import then export gives bitwise the original tensors (names,
dtypes, shapes, bytes). The HF config comes from `hf_config` (a directory or config.json), else
from config.json next to the checkpoint's tracker, else from the args a converted checkpoint
stores.
"""

from __future__ import annotations

import json
import os

import torch

from gigatron.convert._ckpt_layout import entry_shape, load_entry, per_layer_entries
from gigatron.convert._hf_sizes import check_layer_count
from gigatron.convert._recipe_ops import hf_outputs
from gigatron.convert._recipes import _Every, family_recipes, recipes_for_keys
from gigatron.convert.hf_config import parse_config_json, spec_from_hf_config
from gigatron.convert.hf_io import write_safetensors
from gigatron.convert.hf_to_gigatron import copy_side_files
from gigatron.core import dist_checkpointing
from gigatron.core.dist_checkpointing import (
    check_is_distributed_checkpoint,
    load_common_state_dict,
)
from gigatron.core.dist_checkpointing import checkpoint_files as ckpt_files


def find_checkpoint_dir(load: str) -> str:
    """`load` itself if it is a torch_dist directory, else the one its tracker names."""
    if check_is_distributed_checkpoint(load):
        return load
    found = ckpt_files.tracked_dir(load)
    if found is None:
        raise ValueError(
            f"{load}: neither a torch_dist checkpoint nor a directory with "
            f"{ckpt_files.TRACKER_FNAME}"
        )
    return found


def _hf_config(load: str, ckpt_dir: str, hf_config) -> tuple[dict, str | None]:
    """(config dict, directory to copy tokenizer files from)."""
    if isinstance(hf_config, dict):
        return hf_config, None
    candidates = [hf_config] if hf_config else [load, os.path.dirname(ckpt_dir.rstrip("/"))]
    for c in candidates:
        path = os.path.join(c, "config.json") if os.path.isdir(c) else c
        if os.path.isfile(path):
            return parse_config_json(path), os.path.dirname(path)
    if hf_config:
        raise ValueError(
            f"hf_config ({hf_config!r}) is neither config.json nor a directory with one"
        )
    args = load_common_state_dict(ckpt_dir).get("args")
    if args is None or not getattr(args, "hf_config_json", None):
        raise ValueError(
            f"{load}: no config.json found and the checkpoint args carry none; pass "
            "hf_config (the original HF directory or its config.json)"
        )
    return json.loads(args.hf_config_json), _tokenizer_dir(args, ckpt_dir)


def _tokenizer_dir(args, ckpt_dir: str) -> str | None:
    """The directory of the tokenizer files the checkpoint args name (None: none named)."""
    path = getattr(args, "tokenizer_model", None) or getattr(args, "vocab_file", None)
    if not path:
        return None
    if getattr(args, "tokenizer_in_checkpoint_dir", False):  # written by gigatron convert
        path = os.path.join(os.path.dirname(ckpt_dir.rstrip("/")), path)
    return path if os.path.isdir(path) else os.path.dirname(path) or None


def convert_gigatron_to_hf(
    load: str, out_dir: str, *, hf_config=None, max_shard_bytes: int = 5 * 1024**3
) -> list[str]:
    """Write `out_dir/model*.safetensors` (+ index), config.json and tokenizer files.

    load: a checkpoint root (with a tracker) or a torch_dist directory. Returns the weight files.
    """
    ckpt_dir = find_checkpoint_dir(load)
    cfg, side_dir = _hf_config(load, ckpt_dir, hf_config)
    entries = per_layer_entries(dist_checkpointing.load_tensors_metadata(ckpt_dir))
    emb = entries.get("embedding.word_embeddings.weight")
    if emb is None:
        raise ValueError(f"{ckpt_dir}: no embedding.word_embeddings.weight (not a GPT checkpoint?)")
    parts = [k.split(".") for k in entries if k.startswith("decoder.layers.")]
    layers = {int(p[2]) for p in parts if p[2].isdigit()}  # per-layer names: decoder.layers.{i}.
    source = os.path.join(side_dir, "config.json") if side_dir else "the HF config.json"
    check_layer_count(cfg, layers, source)  # before a recipe is planned per declared layer
    spec = spec_from_hf_config(cfg)
    recipes = recipes_for_keys(spec, entries, entry_shape(emb)[0])
    check_complete(spec, recipes, entries)

    def meta(key):
        return torch.empty(entry_shape(entries[key]), dtype=entries[key][2].dtype, device="meta")

    plan = [(k, tuple(t.shape), t.dtype) for k, t in hf_outputs(recipes, meta)]

    def produce():
        yield from hf_outputs(recipes, lambda key: load_entry(entries[key], ckpt_dir))

    os.makedirs(out_dir, exist_ok=True)
    files = write_safetensors(out_dir, plan, produce(), max_shard_bytes=max_shard_bytes)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for src in {side_dir, load, os.path.dirname(ckpt_dir.rstrip("/"))} - {None}:
        if os.path.isdir(src) and os.path.abspath(src) != os.path.abspath(out_dir):
            copy_side_files(src, out_dir, with_config=False)
    return files


def check_complete(spec, recipes, entries) -> None:
    """Every model tensor of the checkpoint must be exported (none silently dropped)."""
    fn = family_recipes(spec.family)
    possible = {r.key for r in fn(spec, _Every(), spec.padded_vocab_size)}
    model_keys = {k for k in entries if k.startswith(("embedding.", "decoder.", "output_layer."))}
    unknown = sorted(model_keys - possible - ({"output_layer.weight"} if spec.tied else set()))
    if unknown:
        raise ValueError(f"checkpoint tensors with no HF mapping for {spec.family}: {unknown[:8]}")
    needed = {r.key for r in fn(spec, _Every(), spec.padded_vocab_size)}
    absent = sorted(k for k in needed - set(entries) if not k.endswith(".bias"))
    if absent:
        raise ValueError(f"checkpoint lacks tensors the {spec.family} model needs: {absent[:8]}")
