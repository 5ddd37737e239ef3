"""Build core configs (TransformerConfig, DDP, optimizer) from Megatron-style training args.

Each config is filled by field name from the parsed flags (a flag named like a field sets it);
`TRANSFORMER_EXCEPTIONS` is the one table of flags whose name or meaning differs from their
field, as Megatron's core_transformer_config_from_args lists its own."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from gigatron.core.activations import quick_gelu, squared_relu  # `--quick-geglu`, `--squared-relu`
from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import OptimizerConfig
from gigatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from gigatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from gigatron.training.utils import args_by_name


def openai_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (GPT-2's), Megatron's `--openai-gelu`."""
    return F.gelu(x, approximate="tanh")


def _activation(args):
    if getattr(args, "squared_relu", False):
        return squared_relu
    if args.swiglu:
        return F.silu
    if getattr(args, "quick_geglu", False):
        return quick_gelu
    return openai_gelu if args.openai_gelu else F.gelu


def _yarn(args, name: str):
    """Flag `name` for a yarn_* field with --position-embedding-type yarn (not MLA, whose
    config has YaRN fields of its own); None (the field's default) otherwise."""
    if getattr(args, "position_embedding_type", None) != "yarn":
        return None
    return None if getattr(args, "multi_latent_attention", False) else getattr(args, name, None)


def fields_from_args(cls, args, *, skip=()) -> dict:
    """{field: args.field} for each field of dataclass `cls` that `args` has (less `skip`):
    a flag fills the config field of its own name (Megatron's _default_config_from_args)."""
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.init and f.name not in skip and hasattr(args, f.name)
    }


# Parsed flags that reach a TransformerConfig field of ANOTHER name or meaning: the exceptions to
# filling the config by field name. field -> value from the args (None: leave the default).
TRANSFORMER_EXCEPTIONS = {
    "layernorm_epsilon": lambda a: a.norm_epsilon,
    "add_bias_linear": lambda a: not a.disable_bias_linear,
    "gated_linear_unit": lambda a: a.swiglu or getattr(a, "quick_geglu", False),
    "activation_func": _activation,
    "num_moe_experts": lambda a: a.num_experts or None,
    "pipeline_dtype": lambda a: a.params_dtype,
    "use_cpu_initialization": lambda a: True,  # TP-invariant init: weights are made on CPU
    "transformer_impl": lambda a: "local",  # no Transformer Engine
    # False only from `gigatron estimate`, which builds the model on meta for its shapes
    "perform_initialization": lambda a: getattr(a, "perform_initialization", True),
    "gradient_accumulation_fusion": lambda a: getattr(a, "gradient_accumulation_fusion", True),
    "wgrad_gemm_accum_fp32": lambda a: getattr(a, "wgrad_gemm_accum_fp32", True),
    "layernorm_zero_centered_gamma": lambda a: getattr(a, "apply_layernorm_1p", False) or None,
    # Megatron: --apply-query-key-layer-scaling computes the softmax in fp32 too
    "attention_softmax_in_fp32": lambda a: (
        getattr(a, "apply_query_key_layer_scaling", None) or None
    ),
    "cp_comm_type": lambda a: a.cp_comm_type if a.context_parallel_size > 1 else None,
    "rope_type": lambda a: getattr(a, "rope_type", None),
    "original_max_position_embeddings": lambda a: a.yarn_original_max_position_embeddings,
    "beta_fast": lambda a: a.yarn_beta_fast,
    "beta_slow": lambda a: a.yarn_beta_slow,
    # GPTModel's YaRN positions (Megatron's _apply_yarn_config_from_args: the same flags)
    "yarn_rotary_scaling_factor": lambda a: _yarn(a, "rotary_scaling_factor"),
    "yarn_original_max_position_embeddings": lambda a: _yarn(
        a, "yarn_original_max_position_embeddings"
    ),
    "yarn_beta_fast": lambda a: _yarn(a, "yarn_beta_fast"),
    "yarn_beta_slow": lambda a: _yarn(a, "yarn_beta_slow"),
    "yarn_mscale": lambda a: _yarn(a, "mscale"),
    "yarn_mscale_all_dim": lambda a: _yarn(a, "mscale_all_dim"),
    "yarn_correction_range_round_to_int": lambda a: _yarn(a, "yarn_correction_range_round_to_int"),
}

# flags named like a TransformerConfig field that must not reach it: Megatron's kernel-fusion
# switches, accepted as no-ops (compat_flags.NO_OPS), whose flag defaults differ from the
# fields' (filled by name they would ask for fused kernels gigatron has not)
NOT_FROM_FLAGS = (
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "async_tensor_model_parallel_allreduce",
    "overlap_p2p_comm",
    "moe_permute_fusion",
    "moe_router_fusion",
    "barrier_with_L1_time",
    # backend choices the training layer answers (compat.training_args.BACKEND_ONLY)
    "moe_flex_dispatcher_backend",
    "disable_bf16_reduced_precision_matmul",
)


def core_transformer_config_from_args(args, config_class=None):
    """`TransformerConfig` for the model the flags describe (Megatron's helper of the same name):
    every field from the flag of its name, then `TRANSFORMER_EXCEPTIONS`; MLATransformerConfig
    with --multi-latent-attention."""
    config_class = config_class or TransformerConfig
    if getattr(args, "multi_latent_attention", False) and config_class is TransformerConfig:
        config_class = MLATransformerConfig
    skip = (*NOT_FROM_FLAGS, *TRANSFORMER_EXCEPTIONS)
    kw = fields_from_args(config_class, args, skip=skip)
    names = {f.name for f in dataclasses.fields(config_class)}
    for name, value in TRANSFORMER_EXCEPTIONS.items():
        value = value(args) if name in names else None
        if value is not None:
            kw[name] = value
    return config_class(**kw)


def ddp_config_from_args(args):
    """DistributedDataParallelConfig by field name; bf16 keeps fp32 gradient buffers."""
    # --use-nccl-ub / --fsdp-manual-registration: backend flags answered by one printed line
    kw = fields_from_args(
        DistributedDataParallelConfig, args, skip=("nccl_ub", "fsdp_manual_registration")
    )
    # Megatron: bf16 reduces in fp32 unless --grad-reduce-in-bf16
    bf16_fp32 = args.bf16 and not getattr(args, "grad_reduce_in_bf16", False)
    kw["grad_reduce_in_fp32"] = args.accumulate_allreduce_grads_in_fp32 or bf16_fp32
    if args.ddp_bucket_size is not None:
        kw["bucket_size"] = args.ddp_bucket_size
    return DistributedDataParallelConfig(**kw)


def optimizer_config_from_args(args):
    """OptimizerConfig by field name. Not from the flags: --fp8-recipe (the model's),
    Megatron's timer switch (a no-op), and --overlap-param-gather, which the DDP config carries
    (the optimizer reads it there; without --use-distributed-optimizer it is ignored, as before)."""
    skip = ("fp8_recipe", "barrier_with_L1_time", "overlap_param_gather")
    kw = fields_from_args(OptimizerConfig, args, skip=skip)
    kw["log_num_zeros_in_grad"] = bool(kw.get("log_num_zeros_in_grad", False))
    return OptimizerConfig(**kw)


_SCHEDULER_FLAGS = """min_lr lr_decay_style lr_wsd_decay_style use_checkpoint_opt_param_scheduler
override_opt_param_scheduler"""
"""Flags OptimizerParamScheduler takes under their own names."""


def scheduler_from_args(args, optimizer):
    """Megatron's get_optimizer_param_scheduler: steps count samples; the weight decay goes from
    --start- to --end-weight-decay over the whole run (train iters x global batch, or
    --train-samples), independent of the learning-rate decay length."""

    if args.train_iters is not None:
        decay_steps = (args.lr_decay_iters or args.train_iters) * args.global_batch_size
        wd_incr_steps = args.train_iters * args.global_batch_size
        warmup_steps = (
            args.lr_warmup_fraction * decay_steps
            if args.lr_warmup_fraction is not None
            else args.lr_warmup_iters * args.global_batch_size
        )
        wsd_steps = (args.lr_wsd_decay_iters or 0) * args.global_batch_size
    else:
        decay_steps = getattr(args, "lr_decay_samples", None) or args.train_samples
        warmup_steps = (
            args.lr_warmup_fraction * decay_steps
            if args.lr_warmup_fraction is not None
            else getattr(args, "lr_warmup_samples", 0) or 0
        )
        wsd_steps = getattr(args, "lr_wsd_decay_samples", None) or 0
        wd_incr_steps = args.train_samples
    start_wd = getattr(args, "start_weight_decay", None)
    end_wd = getattr(args, "end_weight_decay", None)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=getattr(args, "lr_warmup_init", 0.0) if warmup_steps else args.lr,
        max_lr=args.lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_steps,
        start_wd=args.weight_decay if start_wd is None else start_wd,
        end_wd=args.weight_decay if end_wd is None else end_wd,
        wd_incr_steps=wd_incr_steps,
        wd_incr_style=getattr(args, "weight_decay_incr_style", "constant"),
        wsd_decay_steps=wsd_steps or None,
        # resuming: the saved schedule must match these values unless one of the two flags
        # (use_checkpoint_opt_param_scheduler, override_opt_param_scheduler) says which wins
        **args_by_name(args, _SCHEDULER_FLAGS),
    )


def model_dtype(args) -> torch.dtype:
    return args.params_dtype
