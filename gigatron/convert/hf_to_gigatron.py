"""HF model directory -> gigatron training checkpoint (torch_dist), or straight into a model.

No counterpart in megatron.core (Megatron ships converters under tools/checkpoint). Output layout
is the one `gigatron.training.checkpointing` reads: `<out>/release/` (a torch_dist checkpoint
holding `model`, `args`, `checkpoint_version`, `iteration`) and `latest_checkpointed_iteration.txt`
= `release` (Megatron's convention: loading it is always a fine-tune start). Every tensor is stored
as one global tensor, so the checkpoint loads at any TP x PP (x EP) layout; the target TP only
decides the vocabulary padding. config.json, tokenizer files and `gigatron_flags.txt` (the
`gigatron train` model flags) are copied / written next to the tracker.

Memory: HF tensors are memory-mapped; tensors that need a transform (fused QKV, GLU fc1, GPT-2
transposes, vocab padding) are computed one at a time into a scratch safetensors file, which is
memory-mapped back for the save, so peak memory is about one tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import torch

from gigatron.convert._ckpt_layout import (
    fill_from_parts,
    fill_request,
    model_request,
    one_rank_world,
)
from gigatron.convert._part_reader import PartReader
from gigatron.convert._recipes import recipes_for
from gigatron.convert.hf_config import (
    MODEL_ARGS,
    TOKENIZER_PATH_ARGS,
    HFModelSpec,
    args_to_flags,
    is_hf_dir,
    read_hf_config,
    spec_from_hf_config,
    tokenizer_args,
)
from gigatron.convert.hf_io import HFReader, iter_planned, write_safetensors
from gigatron.core import dist_checkpointing
from gigatron.core.dist_checkpointing.checkpoint_files import (
    CHECKPOINT_VERSION,
    TRACKER_FNAME,
    lock_save_dir,
    unlock_save_dir,
)
from gigatron.core.untrusted_files import confined_path, read_bytes

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)
FLAGS_FNAME = "gigatron_flags.txt"
_SCRATCH = ".convert_scratch"


def copy_side_files(src_dir: str, out_dir: str, *, with_config: bool = True) -> list[str]:
    """Copy config.json (optional) and the tokenizer / generation files present in src_dir.

    src_dir is untrusted: each file must resolve inside it (a symlink to a file elsewhere is
    refused, not copied into the output) and be a regular file within its size limit (a FIFO or
    a link to a device is refused before a byte is read)."""
    names = (("config.json",) if with_config else ()) + TOKENIZER_FILES
    copied = []
    for name in names:
        if not os.path.lexists(os.path.join(src_dir, name)):
            continue
        src = confined_path(src_dir, name, what="side file", source=f"directory {src_dir}")
        limit = "json_small" if name == "config.json" else "tokenizer"
        data = read_bytes(src, what="side file", max_bytes=limit)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        copied.append(name)
    return copied


def _gather_inputs(reader: HFReader, recipe, meta: bool):
    return [reader.meta(k) if meta else reader.get(k) for k in recipe.hf_keys]


def megatron_tensors(reader: HFReader, recipes, scratch_dir: str) -> dict[str, torch.Tensor]:
    """{Megatron key: file-backed tensor}: renames map the HF file, transforms the scratch file."""
    direct, plan = {}, []
    for r in recipes:
        inputs = _gather_inputs(reader, r, meta=True)
        out = r.to_gig(*inputs)
        if any(out is t for t in inputs):
            direct[r.key] = reader.get(r.hf_keys[[out is t for t in inputs].index(True)])
        else:
            plan.append((r.key, tuple(out.shape), out.dtype))
    if not plan:
        return direct
    os.makedirs(scratch_dir, exist_ok=True)
    by_key = {r.key: r for r in recipes}
    write_safetensors(
        scratch_dir,
        plan,
        iter_planned(plan, lambda k: by_key[k].to_gig(*_gather_inputs(reader, by_key[k], False))),
        max_shard_bytes=1 << 62,
    )
    scratch = HFReader(scratch_dir)
    return {**direct, **{k: scratch.get(k) for k, _, _ in plan}}


def _checkpoint_args(spec: HFModelSpec, hf_dir: str, tp: int, pp: int, ep: int, divisible_by: int):
    """The args saved in the checkpoint: the model (`training_args`), the tokenizer (files copied
    next to the tracker, named relative to it so the directory can move), the layout it was
    converted for, and the HF config for the way back."""
    return argparse.Namespace(
        **spec.training_args(),
        **tokenizer_args(hf_dir, path="."),
        tokenizer_in_checkpoint_dir=True,
        make_vocab_size_divisible_by=divisible_by,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        hf_model_type=spec.family,
        hf_config_json=json.dumps(spec.hf_config, sort_keys=True),
    )


def training_flags(args: argparse.Namespace, out_dir: str) -> list[str]:
    """`gigatron_flags.txt`: the model and tokenizer fields of the saved `args` as `gigatron
    train` flags, the tokenizer files named under `out_dir` (as given to the converter)."""
    fields = {k: getattr(args, k) for k in MODEL_ARGS if hasattr(args, k)}
    for key in TOKENIZER_PATH_ARGS:
        if fields.get(key) is not None:
            fields[key] = os.path.normpath(os.path.join(out_dir, fields[key]))
    return args_to_flags(fields)


def convert_hf_to_gigatron(
    hf_dir: str,
    out_dir: str,
    *,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    make_vocab_size_divisible_by: int = 128,
) -> HFModelSpec:
    """Write `out_dir/release` + tracker from the HF model in `hf_dir`; returns the spec.

    The layout sizes are checked against the model (divisibility) and recorded in the args; the
    checkpoint itself loads at any layout (dist_checkpointing reshards).
    """
    tp, pp, ep = (
        tensor_model_parallel_size,
        pipeline_model_parallel_size,
        expert_model_parallel_size,
    )
    reader = HFReader(hf_dir)  # headers only: config.json's sizes are checked against them
    spec = spec_from_hf_config(
        read_hf_config(hf_dir, reader),
        tensor_model_parallel_size=tp,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    )
    # The config's own checks reject a layout the model cannot take (heads % tp, layers % pp ...).
    spec.transformer_config(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        pipeline_dtype=torch.float32,
    )
    if spec.config_kwargs["num_layers"] % pp:
        raise ValueError(
            f"num_layers ({spec.config_kwargs['num_layers']}) must be divisible by "
            f"pipeline_model_parallel_size ({pp})"
        )
    recipes = recipes_for(spec, reader.keys())
    ckpt_dir = os.path.join(out_dir, "release")
    scratch = os.path.join(out_dir, _SCRATCH)
    args = _checkpoint_args(spec, hf_dir, tp, pp, ep, make_vocab_size_divisible_by)
    taken = lock_save_dir(out_dir)  # one writer per save root: a job saving there is refused
    try:
        _write_release(out_dir, hf_dir, ckpt_dir, scratch, spec, reader, recipes, args)
    finally:
        if taken:
            unlock_save_dir(out_dir)
    return spec


def _write_release(out_dir, hf_dir, ckpt_dir, scratch, spec, reader, recipes, args) -> None:
    os.makedirs(ckpt_dir, exist_ok=True)
    try:
        tensors = megatron_tensors(reader, recipes, scratch)
        with one_rank_world():
            state = {
                "model": fill_request(model_request(spec), tensors),
                "args": args,
                "checkpoint_version": CHECKPOINT_VERSION,
                "iteration": 0,
                "num_floating_point_operations_so_far": 0,
            }
            dist_checkpointing.save(state, ckpt_dir)
        del tensors, state
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out_dir, TRACKER_FNAME), "w") as f:
        f.write("release")
    copy_side_files(hf_dir, out_dir)
    with open(os.path.join(out_dir, FLAGS_FNAME), "w") as f:
        f.write(" ".join(training_flags(args, out_dir)) + "\n")


def _unwrap(chunk):
    while hasattr(chunk, "module"):  # DDP / Float16Module wrappers
        chunk = chunk.module
    return chunk


def load_hf_into_model(model_chunks, hf_dir: str, *, reader: HFReader | None = None) -> HFModelSpec:
    """Fill this rank's GPTModel chunks (any TP x PP x VP x EP layout) from a HF directory.

    Streaming: each rank reads only the bytes of its own pieces (its layers, experts, TP
    slices), one piece at a time (`_part_reader`); recipes that are not row movements (GPT-2's
    transposes) read one tensor whole. Peak host memory is this rank's model plus one piece
    (one HF tensor at most). `reader`: an open HFReader of `hf_dir` (its byte counters).
    Call it after the model is built and before training; with a mixed-precision optimizer
    call `optimizer.reload_model_params()` afterwards so the fp32 main copies follow.
    """
    chunks = [
        _unwrap(c) for c in (model_chunks if isinstance(model_chunks, list) else [model_chunks])
    ]
    reader = reader or HFReader(hf_dir)
    spec = spec_from_hf_config(read_hf_config(hf_dir, reader))
    for chunk in chunks:
        sharded = chunk.sharded_state_dict()
        vocab = next(
            (sh for sh in sharded.values() if sh.key == "embedding.word_embeddings.weight"), None
        ) or sharded.get("output_layer.weight")
        padded = vocab.global_shape[0] if vocab is not None else None
        by_key = {r.key: r for r in recipes_for(spec, reader.keys(), padded)}
        if spec.tied and "output_layer.weight" not in by_key:
            by_key["output_layer.weight"] = by_key["embedding.word_embeddings.weight"]
        fill_from_parts(sharded, PartReader(reader, by_key, hf_dir))
    return spec


def load_hf_for_training(model_chunks, optimizer, load_dir: str | None) -> bool:
    """The training loop's hook: if `load_dir` is a HF directory, fill the model from it,
    refresh the optimizer's fp32 main copies, and return True (start at iteration 0, as
    --finetune); otherwise do nothing and return False (load a gigatron checkpoint instead)."""
    if not is_hf_dir(load_dir):
        return False
    load_hf_into_model(model_chunks, load_dir)
    if optimizer is not None and hasattr(optimizer, "reload_model_params"):
        optimizer.reload_model_params()
    return True
