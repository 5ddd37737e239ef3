"""What a checkpoint's saved args carry, and the training arguments taken from them.

`saved_checkpoint` / `saved_args` read the args Namespace a checkpoint saved (the one reader:
resume checks, `--use-checkpoint-args`, the vocabulary padding and `gigatron generate` use it).

`gigatron train --load OUT` and `gigatron generate --load OUT` (OUT written by `gigatron
convert`, or saved by a run that started from one) and `--load HF_DIR` take the model shape,
the sequence length and the tokenizer from there, so no model flags are needed; a flag given on
the command line (or in --yaml-cfg) wins. Megatron-LM does this only when asked
(`--use-checkpoint-args`, `load_args_from_checkpoint`); a converted checkpoint describes
nothing else, so here it is the default. Which fields: `hf_config.MODEL_ARGS`.
"""

from __future__ import annotations

import argparse
import json
import os

from gigatron.convert.hf_config import (
    MODEL_ARGS,
    TOKENIZER_PATH_ARGS,
    is_hf_dir,
    read_hf_config,
    spec_from_hf_config,
    tokenizer_args,
)
from gigatron.core import dist_checkpointing
from gigatron.core.dist_checkpointing import checkpoint_files as ckpt_files
from gigatron.core.untrusted_yaml import read_yaml


def command_line_dests(parser: argparse.ArgumentParser, argv: list[str], yaml_cfg=None) -> set:
    """Destinations of the flags present in `argv` and of the keys of the YAML file."""
    actions = parser._option_string_actions
    given = {actions[a.split("=")[0]].dest for a in argv if a.split("=")[0] in actions}
    if yaml_cfg:
        values = read_yaml(yaml_cfg, what="--yaml-cfg") or {}
        if isinstance(values, dict):
            given |= {str(k).lstrip("-").replace("-", "_") for k in values}
    return given


def saved_checkpoint(root: str) -> tuple[str, object] | None:
    """(checkpoint directory, its saved args or None) for the tracker under `root`, or None
    when `root` holds no complete checkpoint (load_checkpoint reports that case)."""
    ckpt_dir = ckpt_files.tracked_dir(root, warn=False) if root else None
    if ckpt_dir is None or not dist_checkpointing.check_is_distributed_checkpoint(ckpt_dir):
        return None
    return ckpt_dir, dist_checkpointing.load_common_state_dict(ckpt_dir).get("args")


def saved_args(load: str):
    """The args Namespace saved in the checkpoint `load`'s tracker names (None: none)."""
    found = saved_checkpoint(load)
    return None if found is None else found[1]


def hf_dir_args(hf_dir: str) -> dict:
    """The argument fields a Hugging Face directory describes (config.json, tokenizer files)."""
    spec = spec_from_hf_config(read_hf_config(hf_dir))
    fields = spec.training_args()
    fields.pop("padded_vocab_size")  # depends on the run's TP and divisor
    fields.update(tokenizer_args(hf_dir, path=os.path.abspath(hf_dir)))
    fields.update(
        hf_model_type=spec.family, hf_config_json=json.dumps(spec.hf_config, sort_keys=True)
    )
    return fields


# Families whose model features have no `gigatron train` flags yet: their saved args cannot
# describe the model, so train / generate --load refuse them instead of building another model.
NO_TRAINING_FLAGS = ("gemma2", "gemma3_text")


def _check_flags_exist(family: str, load: str) -> None:
    if family in NO_TRAINING_FLAGS:
        raise ValueError(
            f"{load}: a {family} model (sliding-window layers, logit soft-capping, sandwich "
            "norms) has no gigatron train flags yet; build it in Python (gigatron.convert: "
            "spec_from_hf_config(...).build_model() + load_hf_into_model, docs/convert.md)"
        )


def checkpoint_model_args(load: str | None) -> tuple[dict, str] | None:
    """(argument fields, where they came from) when `load` is a HF directory or a checkpoint
    whose args say it came from Hugging Face (`hf_model_type`); None otherwise.

    A checkpoint written by `gigatron convert` names its tokenizer files relative to its own
    directory; they are returned as absolute paths."""
    if not load:
        return None
    if is_hf_dir(load):
        fields = hf_dir_args(load)
        _check_flags_exist(fields["hf_model_type"], load)
        return fields, f"a Hugging Face {fields['hf_model_type']} directory (from its config.json)"
    saved = saved_args(load)
    if saved is None or not getattr(saved, "hf_model_type", None):
        return None
    _check_flags_exist(saved.hf_model_type, load)
    fields = {k: getattr(saved, k) for k in MODEL_ARGS if hasattr(saved, k)}
    if getattr(saved, "tokenizer_in_checkpoint_dir", False):
        for key in TOKENIZER_PATH_ARGS:
            if fields.get(key) is not None:
                fields[key] = os.path.abspath(os.path.join(load, fields[key]))
    what = f"a {saved.hf_model_type} checkpoint from Hugging Face (from its saved args)"
    return fields, what


def apply_checkpoint_model_args(args, given: set, *, quiet: bool = False) -> list[str] | None:
    """Set the fields `checkpoint_model_args(args.load)` gives, except those in `given`; print
    one line on rank 0 saying what is loaded and which args came from it. Returns the names
    set (None when `--load` is neither a HF directory nor a checkpoint converted from one)."""
    found = checkpoint_model_args(getattr(args, "load", None))
    if found is None:
        return None
    fields, what = found
    taken = [k for k in fields if k not in given]
    for key in taken:
        setattr(args, key, fields[key])
    if not quiet and int(os.environ.get("RANK", "0")) == 0:
        kept = sorted(k for k in fields if k in given)
        own = f"; from the command line: {', '.join(kept)}" if kept else ""
        print(f"loading {args.load}: {what}: {', '.join(taken)}{own}", flush=True)
    return taken


def hf_dir_vocab(args) -> argparse.Namespace | None:
    """For `--load HF_DIR`: the padded vocabulary of its config.json at this run's TP and
    divisor, in the shape of saved args (HF configs may pad beyond the tokenizer's vocabulary:
    the model keeps every row the weights have)."""
    load = getattr(args, "load", None)
    if not is_hf_dir(load):
        return None
    divisor, tp = args.make_vocab_size_divisible_by, args.tensor_model_parallel_size
    spec = spec_from_hf_config(
        read_hf_config(load), make_vocab_size_divisible_by=divisor, tensor_model_parallel_size=tp
    )
    return argparse.Namespace(
        padded_vocab_size=spec.padded_vocab_size, make_vocab_size_divisible_by=divisor
    )
