"""What a resumed run must share with its checkpoint, and the args it may take from it.

Part of `gigatron.training.checkpointing` (mirrors `megatron.training.checkpointing`'s
`check_checkpoint_args` and `load_args_from_checkpoint`, and the resume rules of Megatron's
`OptimizerParamScheduler`):

- `check_checkpoint_args`: a resumed run (no `--finetune`) builds the checkpoint's model. Megatron
  compares num_layers, hidden_size, num_attention_heads, add_position_embedding and, with a
  vocab file, max_position_embeddings and tokenizer_type; gigatron also the query groups, the
  position-embedding type and the switches that change the model's function without changing a
  tensor's shape (normalization, activation, tied output, experts), and the NullTokenizer's
  --vocab-size. Shapes the load itself checks (ffn / kv sizes) and the padded vocabulary (the
  load pads or trims its rows) are left to the load.
- `load_args_from_checkpoint` (`--use-checkpoint-args`): Megatron's model fields, before the model
  is built; the ones Megatron forces replace command-line values, the others fill unset ones.
- `schedule_mismatch`: the scheduler's ScheduleMismatchError told in flags.
- `check_seed` / `optimizer_drift` (gigatron: Megatron checks neither): a resumed training run
  with another --seed (the data order) or other optimizer hyperparameters (Adam's betas and
  epsilon and SGD's momentum, which the checkpoint's param groups would silently replace;
  --clip-grad) is refused naming both values and the way out, as a schedule mismatch is.
"""

from __future__ import annotations

import os

from gigatron.training.checkpoint_args import saved_checkpoint
from gigatron.training.global_vars import get_args
from gigatron.training.utils import print_rank_0

# Fields a resumed run must share with its checkpoint (see the module doc).
CHECKED_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "position_embedding_type",
    "add_position_embedding",
    "max_position_embeddings",
    "normalization",
    "swiglu",
    "openai_gelu",
    "squared_relu",
    "quick_geglu",
    "window_size",
    "window_attn_skip_freq",
    "softmax_type",
    "untie_embeddings_and_output_weights",
    "num_experts",
    "tokenizer_type",
    "vocab_size",
)

# --use-checkpoint-args: Megatron's load_args_from_checkpoint lists, in gigatron's spellings
# (gigatron's --disable-bias-linear for Megatron's add_bias_linear; --openai-gelu,
# --qk-layernorm and --norm-epsilon, which Megatron's list lacks, change the model too).
FILL_FIELDS = (  # taken when the flag is unset (None)
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "seq_length",
    "num_attention_heads",
    "kv_channels",
    "max_position_embeddings",
    "moe_token_dispatcher_type",
    # tokenizer: Megatron forces these (--use-tokenizer-model-from-checkpoint-args); here a
    # path given on the command line wins (checkpoints move between machines)
    "tokenizer_type",
    "tokenizer_model",
    "vocab_file",
    "merge_file",
    "vocab_size",
)
FORCE_FIELDS = (  # the checkpoint's value replaces the command line's
    "num_query_groups",
    "group_query_attention",
    "position_embedding_type",
    "add_position_embedding",
    "use_rotary_position_embeddings",
    "rotary_base",
    "rotary_percent",
    "rotary_interleaved",
    "disable_bias_linear",
    "add_qkv_bias",
    "squared_relu",
    "swiglu",
    "quick_geglu",
    "glu_linear_offset",
    "activation_func_clamp_value",
    "window_size",
    "window_attn_skip_freq",
    "softmax_type",
    "openai_gelu",
    "qk_layernorm",
    "untie_embeddings_and_output_weights",
    "apply_layernorm_1p",
    "normalization",
    "norm_epsilon",
    "apply_query_key_layer_scaling",
    "attention_dropout",
    "hidden_dropout",
    "num_experts",
    "moe_layer_freq",
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "moe_router_pre_softmax",
    "moe_grouped_gemm",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_gate",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_topk_scaling_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "rope_type",
    "rotary_scaling_factor",
    "mscale",
    "mscale_all_dim",
)


def _applies(name: str, args, ckpt) -> bool:
    if name == "max_position_embeddings":  # a weight's shape only for learned positions
        return (
            "learned_absolute"
            == getattr(args, "position_embedding_type", None)
            == getattr(ckpt, "position_embedding_type", None)
        )
    if name == "num_query_groups":  # derived from the heads without group-query attention
        return getattr(args, "group_query_attention", False) or getattr(
            ckpt, "group_query_attention", False
        )
    if name in ("tokenizer_type", "vocab_size"):  # unset on either side: nothing to compare
        return getattr(args, name, None) is not None and getattr(ckpt, name, None) is not None
    return True


def check_checkpoint_args(checkpoint_args, args=None, skip_args=None, where: str = "") -> None:
    """ValueError naming every field of `CHECKED_FIELDS` where `args` (default: the global args)
    and `checkpoint_args` differ; fields either side lacks are skipped (older checkpoints, the
    partial args of tools). `where` names the checkpoint in the message."""
    args = get_args() if args is None else args
    default = {"add_position_embedding": True}
    diffs = []
    for name in CHECKED_FIELDS:
        if name in (skip_args or ()) or not hasattr(args, name):
            continue
        if not hasattr(checkpoint_args, name) and name not in default:
            continue
        saved = getattr(checkpoint_args, name, default.get(name))
        if _applies(name, args, checkpoint_args) and getattr(args, name) != saved:
            diffs.append(f"{name} {getattr(args, name)} (checkpoint: {saved})")
    if diffs:
        raise ValueError(
            f"the model flags differ from the checkpoint {where or 'being loaded'}: "
            f"{', '.join(diffs)}; a resumed run builds the checkpoint's model: change those "
            "flags, or pass --use-checkpoint-args to take the model flags from the checkpoint, "
            "or --finetune to load only its weights into this model"
        )


def load_args_from_checkpoint(args, load_arg: str = "load"):
    """Megatron's `--use-checkpoint-args`: set the model fields (`FILL_FIELDS` when unset,
    `FORCE_FIELDS` always) from the args saved in the checkpoint under `args.<load_arg>`, before
    the model is built; one line on rank 0 says which. Returns (args, checkpoint args or None)
    (Megatron returns args alone when there is nothing to load)."""
    root = getattr(args, load_arg, None)
    found = saved_checkpoint(root) if root else None
    if found is None or found[1] is None:
        what = "no checkpoint" if found is None else "a checkpoint without saved args"
        print_rank_0(f"--use-checkpoint-args: {root} holds {what}; using the flags as given")
        return args, None
    ckpt_dir, ckpt = found
    filled, replaced = [], []
    for name in FILL_FIELDS + FORCE_FIELDS:
        value, old = getattr(ckpt, name, None), getattr(args, name, None)
        if value is None or value == old or (name in FILL_FIELDS and old is not None):
            continue
        derived = name == "num_query_groups" and not getattr(ckpt, "group_query_attention", 0)
        if old is None or derived:
            filled.append(f"{name}={value}")
        else:
            replaced.append(f"{name} {old} -> {value}")
        setattr(args, name, value)
    what = [f"set {', '.join(filled)}"] if filled else []
    what += [f"replacing the command line's {', '.join(replaced)}"] if replaced else []
    print_rank_0(f"--use-checkpoint-args: model flags from {ckpt_dir}: {'; '.join(what)}")
    return args, ckpt


# scheduler state-dict key -> the flags that set it (steps count samples)
_SCHEDULE_FLAGS = {
    "max_lr": "--lr",
    "min_lr": "--min-lr",
    "lr_warmup_steps": "--lr-warmup-{unit} / --lr-warmup-fraction",
    "lr_decay_steps": "--lr-decay-{unit} (default --train-{unit})",
    "lr_decay_style": "--lr-decay-style",
    "start_wd": "--weight-decay / --start-weight-decay",
    "end_wd": "--weight-decay / --end-weight-decay",
    "wd_incr_steps": "--train-{unit}",
    "wd_incr_style": "--weight-decay-incr-style",
}


def _in_samples(key: str, value, args) -> str:
    """A step count (samples) with its iterations when the run counts iterations."""
    batch = getattr(args, "global_batch_size", None)
    if not key.endswith("_steps") or getattr(args, "train_iters", None) is None or not batch:
        return f"{value}"
    return f"{value} samples ({value / batch:g} iterations of {batch})"


def schedule_mismatch(err, args, ckpt_dir: str) -> ValueError:
    """The scheduler's ScheduleMismatchError `err` as a ValueError in flags, with both ways out."""
    unit = "samples" if getattr(args, "train_samples", None) is not None else "iters"
    flags = _SCHEDULE_FLAGS.get(err.key, err.key).format(unit=unit)
    return ValueError(
        f"{flags}: the learning-rate schedule differs from the checkpoint {ckpt_dir}: "
        f"{err.key} is {_in_samples(err.key, err.value, args)} with these flags, "
        f"{_in_samples(err.key, err.checkpoint_value, args)} in the checkpoint; pass "
        "--override-opt_param-scheduler to continue on the flags' schedule, or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's"
    )


def _schedule_source(scheduler) -> str:
    """Which values the scheduler resumed with."""
    if getattr(scheduler, "override_opt_param_scheduler", False):
        return "scheduler on the flags' values (--override-opt_param-scheduler)"
    if getattr(scheduler, "use_checkpoint_opt_param_scheduler", False):
        return "scheduler on the checkpoint's values (--use-checkpoint-opt_param-scheduler)"
    return "scheduler (same values as the flags)"


def check_seed(checkpoint_args, args, ckpt_dir: str) -> str:
    """ValueError when a resumed training run's --seed differs from the checkpoint's (the data
    order is drawn from it: the rest of the epoch would repeat or skip samples), unless
    --override-seed; returns the load line's note of an overridden seed ('' when the same)."""
    seed, saved = getattr(args, "seed", None), getattr(checkpoint_args, "seed", None)
    if seed is None or saved is None or seed == saved:
        return ""
    if not getattr(args, "override_seed", False):
        raise ValueError(
            f"--seed {seed} differs from the checkpoint {ckpt_dir}'s {saved}: the data order is "
            "drawn from the seed, so the rest of the run would repeat or skip samples; pass "
            f"--seed {saved} to continue the checkpoint's order, or --override-seed to draw a "
            "new one"
        )
    return f"seed {seed} (checkpoint: {saved}; --override-seed: the data in a new order)"


# optimizer flag -> the --optimizer it applies to (None: every one)
OPTIMIZER_FIELDS = {
    "adam_beta1": "adam",
    "adam_beta2": "adam",
    "adam_eps": "adam",
    "sgd_momentum": "sgd",
}


def clip_grad_note(checkpoint_args, args) -> str:
    """--clip-grad is no optimizer state (the clipping reads the flag every step): when it
    differs from the checkpoint's, the flag wins and the load line says so ('' otherwise)."""
    value, saved = getattr(args, "clip_grad", None), getattr(checkpoint_args, "clip_grad", None)
    if value is None or saved is None or value == saved:
        return ""
    return f"--clip-grad {value} (checkpoint: {saved}): the flag's value runs"


def _resume_switch(args, scheduler, name: str) -> bool:
    value = getattr(args, name, None)
    return bool(getattr(scheduler, name, False) if value is None else value)


def optimizer_drift(checkpoint_args, args, scheduler, ckpt_dir: str) -> tuple[list, str]:
    """([(field, flags' value, checkpoint's value)], 'flags' | 'checkpoint') for the
    `OPTIMIZER_FIELDS` where a resumed run's flags differ from the checkpoint's saved args. A
    difference needs --override-opt_param-scheduler (the flags' values run) or
    --use-checkpoint-opt_param-scheduler (the checkpoint's), else ValueError naming both values;
    another --optimizer is always refused (its state does not fit)."""
    kind, saved_kind = getattr(args, "optimizer", None), getattr(checkpoint_args, "optimizer", None)
    if kind is not None and saved_kind is not None and kind != saved_kind:
        raise ValueError(
            f"--optimizer {kind} differs from the checkpoint {ckpt_dir}'s {saved_kind}: its "
            f"optimizer state is {saved_kind}'s; pass --optimizer {saved_kind}, or "
            f"--no-load-optim to resume the weights with a fresh {kind} state"
        )
    diffs = []
    for name, applies in OPTIMIZER_FIELDS.items():
        if applies not in (None, kind) or not hasattr(checkpoint_args, name):
            continue
        value, saved = getattr(args, name, None), getattr(checkpoint_args, name)
        if value is not None and value != saved:
            diffs.append((name, value, saved))
    if not diffs:
        return [], ""
    if _resume_switch(args, scheduler, "override_opt_param_scheduler"):
        return diffs, "flags"
    if _resume_switch(args, scheduler, "use_checkpoint_opt_param_scheduler"):
        return diffs, "checkpoint"
    flags = " / ".join(f"--{n.replace('_', '-')}" for n, _, _ in diffs)
    told = ", ".join(f"{n} {v} with these flags, {s} in the checkpoint" for n, v, s in diffs)
    raise ValueError(
        f"{flags}: the optimizer hyperparameters differ from the checkpoint {ckpt_dir}: {told}; "
        "pass --override-opt_param-scheduler to continue on the flags' values, or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's"
    )


def drift_note(diffs: list, source: str) -> str:
    """The load line's note of which optimizer hyperparameters won ('' when none differ)."""
    if not diffs:
        return ""
    if source == "flags":
        what = ", ".join(f"{n} {v} (checkpoint: {s})" for n, v, s in diffs)
        flag = "--override-opt_param-scheduler"
        return f"optimizer hyperparameters on the flags' values ({flag}): {what}"
    what = ", ".join(f"{n} {s} (flags: {v})" for n, v, s in diffs)
    return (
        "optimizer hyperparameters on the checkpoint's values "
        f"(--use-checkpoint-opt_param-scheduler): {what}"
    )


def load_line(
    ckpt_dir: str, iteration: int, args, optimizer, scheduler, with_optim, with_rng, notes=()
):
    """The one line rank 0 prints after a resume: from where, which iteration and consumed
    samples, which parts were loaded (and which schedule and optimizer hyperparameters won), an
    overridden seed, and which parts start fresh."""
    parts, fresh = ["model"], []
    if with_optim and optimizer is not None:
        parts += ["optimizer"] + ([_schedule_source(scheduler)] if scheduler is not None else [])
    elif optimizer is not None:
        fresh.append("optimizer and scheduler (--no-load-optim)")
    (parts if with_rng else fresh).append("RNG")
    consumed = getattr(args, "consumed_train_samples", 0)
    line = f"loaded {os.path.normpath(ckpt_dir)}: iteration {iteration}, consumed samples "
    line += f"{consumed}; {', '.join(parts + [n for n in notes if n])}"
    return line + (f"; fresh: {', '.join(fresh)}" if fresh else "")
