"""Megatron's training flags (`pretrain_gpt.py --num-layers ...`): parse, read YAML, validate.

Mirrors `megatron.training.arguments`: the same flag names, meanings and derived values
(padded vocabulary, data-parallel size, default global batch, ffn/kv sizes). Differences: a flag
mistake is one line naming the closest supported flag, without argparse's usage dump
(`cli_errors`); `--yaml-cfg FILE` holds flags as flat `key: value` lines read through the
same argparse actions (`_yaml_cfg`); `--help` shows the defaults.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from gigatron.compat.errors import ArgumentError
from gigatron.core.models.hybrid.hybrid_layer_allocation import (
    get_hybrid_total_layer_count,
    parse_hybrid_pattern,
)
from gigatron.training import cli_errors
from gigatron.training._config_flags import add_config_flags, add_resume_flags
from gigatron.training._flags import (
    _checkpoint_logging_args,
    _data_args,
    _fp8_args,
    _hybrid_args,
    _lora_args,
    _mla_args,
    _model_args,
    _parallel_args,
    _training_args,
)
from gigatron.training._fsdp_args import check_fsdp_args
from gigatron.training._yaml_cfg import apply_yaml
from gigatron.training.cli_errors import known_flags as _known_flags  # noqa: F401
from gigatron.training.cli_errors import reject_unknown, suggest_flag  # noqa: F401
from gigatron.training.compat_flags import add_compat_args, validate_compat_args


def build_parser(extra_args_provider=None) -> argparse.ArgumentParser:
    prog = cli_errors.program()
    p = cli_errors.ArgumentParser(
        prog=prog,
        usage="%(prog)s [--flag VALUE ...]",  # the flags are listed below, once
        description=cli_errors.description(prog),
        epilog=cli_errors.EPILOG,
        formatter_class=cli_errors.HelpFormatter,
        allow_abbrev=False,
    )
    for adder in (
        _model_args,
        _mla_args,
        _hybrid_args,
        _parallel_args,
        _fp8_args,
        _training_args,
        _data_args,
        _lora_args,
        add_config_flags,
        _checkpoint_logging_args,
        add_compat_args,
    ):
        adder(p)
    if extra_args_provider is not None:
        p = extra_args_provider(p)
    add_resume_flags(p)
    return p


def parse_args(extra_args_provider=None, ignore_unknown_args=False, argv=None, args_defaults=None):
    """Parse (and validate) Megatron-style flags; `argv` defaults to sys.argv[1:]."""
    parser = build_parser(extra_args_provider)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not ignore_unknown_args:
        reject_unknown(parser, unknown)
    if args.yaml_cfg:
        apply_yaml(parser, args, argv)
    for key, value in (args_defaults or {}).items():
        if key == "tokenizer_type" and getattr(args, "vocab_file", None) is None:
            # gigatron: the script's WordPiece / BPE default needs its --vocab-file; without one,
            # --vocab-size alone keeps gigatron's NullTokenizer (Megatron stops on the file)
            continue
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def _check_schedule_units(args) -> None:
    """Megatron's rule: --train-iters training takes the --lr-*-iters flags and --train-samples
    training the --lr-*-samples ones; a flag of the other kind would be silently ignored."""
    by_samples = args.train_samples is not None
    unit, other = ("samples", "iters") if by_samples else ("iters", "samples")
    for name in ("lr-warmup", "lr-decay", "lr-wsd-decay"):
        value = getattr(args, f"{name}-{other}".replace("-", "_"), None)
        if value:  # None, or the warmup's default 0
            raise ValueError(
                f"--{name}-{other} ({value}) does not apply to --train-{unit} training: give "
                f"--{name}-{unit} (Megatron's rule)"
            )


# flags that size, divide or count something -> the lowest value they take (unset ones skipped);
# 0 is Megatron's "off" for the intervals and iteration counts that allow it
_LOWEST = {
    **dict.fromkeys(
        """num_layers hidden_size num_attention_heads seq_length micro_batch_size global_batch_size
        tensor_model_parallel_size pipeline_model_parallel_size context_parallel_size
        expert_model_parallel_size expert_tensor_parallel_size num_experts num_query_groups
        num_layers_per_virtual_pipeline_stage virtual_pipeline_model_parallel_size kv_channels
        ffn_hidden_size make_vocab_size_divisible_by log_interval vocab_size""".split(),
        1,
    ),
    **dict.fromkeys(
        """train_iters train_samples eval_iters eval_interval save_interval exit_interval
        num_workers ckpt_step""".split(),
        0,
    ),
}


# float flags no model config checks -> their rule (unset ones skipped); NaN breaks every rule
# (the model's float fields are TransformerConfig's table, `_config_checks.FLOAT_FIELDS`)
_FLOAT_RULES = {
    ">= 0": lambda v: v >= 0,
    "> 0": lambda v: v > 0,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
}
_FLOAT_FLAGS = {
    **dict.fromkeys(
        """lr min_lr lr_warmup_init weight_decay start_weight_decay end_weight_decay clip_grad
        adam_eps sgd_momentum exit_duration_in_mins""".split(),
        ">= 0",
    ),
    **dict.fromkeys(
        "loss_scale initial_loss_scale loss_scale_window min_loss_scale".split(), "> 0"
    ),
    **dict.fromkeys("adam_beta1 adam_beta2".split(), "in [0, 1)"),
    "lr_warmup_fraction": "in [0, 1]",
}


def _check_float_ranges(args) -> None:
    """Each `_FLOAT_FLAGS` flag a finite number within its rule (a NaN --lr trained on NaN)."""
    for name, rule in _FLOAT_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and _FLOAT_RULES[rule](value)):
            raise ValueError(f"--{name.replace('_', '-')} ({value}) must be a finite number {rule}")


def _check_ranges(args) -> None:
    """Each `_LOWEST` flag at or above its lowest value (a 0 size divided by zero later, or ran
    with a negative count), and --rampup-batch-size's three values >= 1."""
    for name, lowest in _LOWEST.items():
        value = getattr(args, name, None)
        if value is not None and value < lowest:
            raise ValueError(f"--{name.replace('_', '-')} ({value}) must be >= {lowest}")
    if args.rampup_batch_size is None:
        return
    for part, value in zip(("start", "increment", "samples"), args.rampup_batch_size):
        if not str(value).isdigit() or int(value) < 1:
            raise ValueError(f"--rampup-batch-size {part} ({value}) must be an integer >= 1")


def _check_virtual_pipeline(args, pp: int) -> None:
    """Megatron's rule: virtual stages interleave over pipeline ranks, so they need PP > 1."""
    for name in ("num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size"):
        if getattr(args, name) is not None and pp == 1:
            raise ValueError(
                f"--{name.replace('_', '-')} needs --pipeline-model-parallel-size > 1 (the "
                "interleaved schedule spreads virtual stages over pipeline ranks; got 1)"
            )


def _check_rerun_flags(args) -> None:
    """gigatron's rerun state machine runs only 'disabled' (no re-run, no error injection)."""
    mode = getattr(args, "rerun_mode", "disabled")
    if mode != "disabled":
        raise ValueError(
            f"--rerun-mode {mode}: gigatron's rerun state machine runs only 'disabled' (it does "
            "not re-run steps); the NaN / Inf loss check is --check-for-nan-in-loss-and-grad"
        )
    rate = getattr(args, "error_injection_rate", 0)
    if rate != 0:
        raise ValueError(
            f"--error-injection-rate {rate}: gigatron injects no errors (its rerun state "
            "machine runs only 'disabled'); leave it 0"
        )


def _check_sft_flags(args) -> None:
    """--sft reads JSONL conversations through SFTTokenizer and packs them itself (Megatron's
    rules: no mock data, no EOD-based masks)."""
    if args.tokenizer_type != "SFTTokenizer":
        raise ValueError(
            f"--sft needs --tokenizer-type SFTTokenizer (got {args.tokenizer_type}): the chat "
            "template tells prompts from answers"
        )
    if args.mock_data or not args.data_path:
        raise ValueError("--sft needs --data-path FILE.jsonl (conversations), not --mock-data")
    for flag in ("reset_position_ids", "reset_attention_mask"):
        if getattr(args, flag, False):
            raise ValueError(
                f"--sft packs conversations with their own bounds; --{flag.replace('_', '-')} "
                "must be off"
            )


def _check_resume_flags(args) -> None:
    """Megatron's rules for the resume switches."""
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise ValueError(
            "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are "
            "mutually exclusive: the first resumes on the flags' schedule, the second on the "
            "checkpoint's"
        )
    if args.use_checkpoint_args and not args.load:
        raise ValueError(
            "--use-checkpoint-args needs --load DIR: the checkpoint whose saved args give the "
            "model flags"
        )


def _check_validation(args) -> None:
    """Megatron's rules: the evaluation batch sizes default to the training ones, and
    eval_global_batch_size splits into whole microbatches over the data-parallel ranks
    (ArgumentError: Megatron asserts it); several validation sets need full validation."""
    if args.multiple_validation_sets and not args.full_validation:
        raise ValueError(
            "--multiple-validation-sets needs --full-validation (each set would need its own "
            "consumed-samples count to resume; Megatron's rule)"
        )
    if args.validation_set_names and not args.multiple_validation_sets:
        raise ValueError("--validation-set-names needs --multiple-validation-sets")
    if args.eval_global_batch_size is None:
        args.eval_global_batch_size = args.global_batch_size
    if args.eval_micro_batch_size is None:
        args.eval_micro_batch_size = args.micro_batch_size
    gbs, mbs, dp = args.eval_global_batch_size, args.eval_micro_batch_size, args.data_parallel_size
    if gbs < 1 or mbs < 1 or gbs % (mbs * dp):
        raise ArgumentError(
            f"eval_global_batch_size ({gbs}) must be divisible by eval_micro_batch_size "
            f"({mbs}) * data_parallel_size ({dp}) (both >= 1)"
        )


def _hybrid_pattern_sets_layers(args) -> None:
    """Megatron's rule: --hybrid-override-pattern forwards to --hybrid-layer-pattern, which sets
    --num-layers (its layer count) and --is-hybrid-model."""
    override = getattr(args, "hybrid_override_pattern", None)
    if override is not None:
        if args.hybrid_layer_pattern is not None:
            raise ValueError(
                "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be given "
                "(--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern)"
            )
        args.hybrid_layer_pattern = override
    if getattr(args, "hybrid_layer_pattern", None) is None:
        return
    args.num_layers = get_hybrid_total_layer_count(
        parse_hybrid_pattern(args.hybrid_layer_pattern).main_pattern
    )
    args.is_hybrid_model = True


def validate_args(args, world_size: int | None = None):
    """Fill derived values and check the combination, raising ValueError naming the flags."""
    ws = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    args.world_size = ws
    args.rank = int(os.environ.get("RANK", "0"))
    _hybrid_pattern_sets_layers(args)
    for name in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
    ):
        if getattr(args, name) is None:
            raise ValueError(f"--{name.replace('_', '-')} is required")
    _check_ranges(args)
    _check_float_ranges(args)
    _check_rerun_flags(args)
    tp, pp, cp = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
    )
    model_parallel = tp * pp * cp
    if ws % model_parallel:
        raise ValueError(
            f"world size ({ws}) is not divisible by --tensor-model-parallel-size ({tp}) x "
            f"--pipeline-model-parallel-size ({pp}) x --context-parallel-size ({cp})"
            + cli_errors.launch_hint(ws, model_parallel)
        )
    args.data_parallel_size = ws // model_parallel
    if args.step_batch_size_schedule is not None and args.global_batch_size is not None:
        raise ValueError(
            "Cannot specify both --step-batch-size-schedule and --global-batch-size "
            f"({args.global_batch_size}): the schedule gives every step's global batch "
            "(Megatron's rule)"
        )
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % (args.micro_batch_size * args.data_parallel_size):
        raise ValueError(
            f"--global-batch-size ({args.global_batch_size}) must be divisible by "
            f"--micro-batch-size ({args.micro_batch_size}) x data-parallel size "
            f"({args.data_parallel_size})"
        )
    _check_validation(args)
    if args.train_iters is None and args.train_samples is None:
        raise ValueError("one of --train-iters or --train-samples is required")
    if args.train_iters is not None and args.train_samples is not None:
        raise ValueError("--train-iters and --train-samples are mutually exclusive")
    _check_schedule_units(args)
    if args.lr is None:
        raise ValueError("--lr is required")
    if args.fp16 and args.bf16:
        raise ValueError("--fp16 and --bf16 are mutually exclusive")
    if args.reset_attention_mask and cp > 1:
        raise ValueError(
            f"--reset-attention-mask with --context-parallel-size {cp}: context-parallel "
            "attention is causal over the whole sequence and would ignore the per-document "
            "mask"
        )
    if args.dataloader_inter_document_masking:
        if cp > 1:
            raise ValueError(
                f"--dataloader-inter-document-masking with --context-parallel-size {cp}: "
                "packed context parallelism splits every document into 2 x cp chunks, and "
                "GPTDataset's documents have any length (gigatron pads none)"
            )
    if args.sequence_parallel and tp == 1:
        args.sequence_parallel = False  # Megatron silently disables SP at TP=1
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if (
        args.seq_length > args.max_position_embeddings
        and args.position_embedding_type == "learned_absolute"
    ):
        raise ValueError(
            f"--seq-length ({args.seq_length}) exceeds --max-position-embeddings "
            f"({args.max_position_embeddings})"
        )
    if getattr(args, "mtp_num_layers", None) and args.position_embedding_type not in (
        "rope",
        "none",
    ):
        raise ValueError(
            f"--mtp-num-layers ({args.mtp_num_layers}) needs --position-embedding-type rope or "
            f"none (Megatron's rule), got {args.position_embedding_type}"
        )
    if args.hidden_size % args.num_attention_heads and args.kv_channels is None:
        raise ValueError(
            f"--hidden-size ({args.hidden_size}) must be divisible by --num-attention-heads "
            f"({args.num_attention_heads}) unless --kv-channels is set"
        )
    if args.kv_channels is None:
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.ffn_hidden_size is None:
        if args.swiglu:  # Megatron's 2/3 x 4h, rounded down to a multiple of 64
            args.ffn_hidden_size = (
                int((4 * args.hidden_size * 2 / 3) / 64) * 64 or 4 * args.hidden_size
            )
        else:
            args.ffn_hidden_size = 4 * args.hidden_size
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    _check_virtual_pipeline(args, pp)
    if args.num_layers_per_virtual_pipeline_stage is not None:
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ValueError(
                f"layers per pipeline stage ({per_stage}) must be divisible by "
                f"--num-layers-per-virtual-pipeline-stage "
                f"({args.num_layers_per_virtual_pipeline_stage})"
            )
        args.virtual_pipeline_model_parallel_size = (
            per_stage // args.num_layers_per_virtual_pipeline_stage
        )
        if args.virtual_pipeline_model_parallel_size == 1:
            args.virtual_pipeline_model_parallel_size = None
    if args.lr_decay_iters is None and args.train_iters is not None:
        args.lr_decay_iters = args.train_iters
    args.params_dtype = (
        torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    )
    if args.bf16 and args.grad_reduce_in_bf16:  # Megatron: bf16 buffers win over the fp32 ones
        args.accumulate_allreduce_grads_in_fp32 = False
    if args.transformer_impl != "local":
        args.transformer_impl = "local"  # no Transformer Engine: the local spec is the only one
    if args.lora_rank is not None and (args.lora_rank < 1 or not 0 <= args.lora_dropout < 1):
        raise ValueError(
            f"--lora-rank ({args.lora_rank}) must be >= 1 and --lora-dropout "
            f"({args.lora_dropout}) in [0, 1)"
        )
    if args.lora_rank is not None and args.load and not (args.finetune or args.no_load_optim):
        raise ValueError(
            f"--lora-rank with --load {args.load}: the checkpoint is the base model; pass "
            "--finetune (its optimizer state is not the adapters')"
        )
    if args.sft:
        _check_sft_flags(args)
    elif not args.mock_data and not args.data_path:
        raise ValueError("give --data-path PREFIX (or --mock-data for random tokens)")
    elif not args.mock_data:
        cli_errors.check_data_prefixes(args.data_path)
    _check_resume_flags(args)
    check_fsdp_args(args)
    validate_compat_args(args)
    from gigatron.training._profiler import check_profile_args
    from gigatron.training._timeline import check_timeline_args

    check_profile_args(args)
    check_timeline_args(args)
    args.consumed_train_samples = 0
    args.consumed_valid_samples = 0
    return args
