"""Build core configs (TransformerConfig, DDP, optimizer) from Megatron-style training args."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gigatron.core.activations import squared_relu  # Megatron's `--squared-relu`
from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import OptimizerConfig
from gigatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from gigatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig


def openai_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (GPT-2's), Megatron's `--openai-gelu`."""
    return F.gelu(x, approximate="tanh")


def _activation(args):
    if getattr(args, "squared_relu", False):
        return squared_relu
    if args.swiglu:
        return F.silu
    return openai_gelu if args.openai_gelu else F.gelu


_MOE_ROUTER_FIELDS = (
    "moe_router_score_function",
    "moe_router_dtype",
    "moe_router_topk_scaling_factor",
    "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_shared_expert_overlap",
    "moe_input_jitter_eps",
)


_FP8_FIELDS = (
    "fp8",
    "fp8_recipe",
    "fp8_margin",
    "fp8_wgrad",
    "first_last_layers_bf16",
    "num_layers_at_start_in_bf16",
    "num_layers_at_end_in_bf16",
)


def _mla_kwargs(args) -> dict:
    """MLATransformerConfig fields from the --multi-latent-attention group (unset YaRN flags
    keep the config's defaults, as in Megatron)."""
    kw = dict(
        multi_latent_attention=True,
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank,
        qk_head_dim=args.qk_head_dim,
        qk_pos_emb_head_dim=args.qk_pos_emb_head_dim,
        v_head_dim=args.v_head_dim,
        rotary_base=args.rotary_base,
        rotary_percent=args.rotary_percent,
        rotary_scaling_factor=args.rotary_scaling_factor,
        mscale=args.mscale,
        mscale_all_dim=args.mscale_all_dim,
    )
    if args.rope_type is not None:
        kw["rope_type"] = args.rope_type
    for flag, field in (
        ("yarn_original_max_position_embeddings", "original_max_position_embeddings"),
        ("yarn_beta_fast", "beta_fast"),
        ("yarn_beta_slow", "beta_slow"),
    ):
        if getattr(args, flag) is not None:
            kw[field] = getattr(args, flag)
    return kw


def core_transformer_config_from_args(args, config_class=None):
    """`TransformerConfig` for the model the flags describe (Megatron's helper of the same name)."""

    config_class = config_class or TransformerConfig
    kw = dict(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups,
        ffn_hidden_size=args.ffn_hidden_size,
        kv_channels=args.kv_channels,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        apply_residual_connection_post_layernorm=args.apply_residual_connection_post_layernorm,
        layernorm_epsilon=args.norm_epsilon,
        add_bias_linear=not args.disable_bias_linear,
        add_qkv_bias=args.add_qkv_bias,
        gated_linear_unit=args.swiglu,
        activation_func=_activation(args),
        normalization=args.normalization,
        qk_layernorm=args.qk_layernorm,
        rotary_interleaved=args.rotary_interleaved,
        init_method_std=args.init_method_std,
        calculate_per_token_loss=args.calculate_per_token_loss,
        recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        sequence_parallel=args.sequence_parallel,
        fp16=args.fp16,
        bf16=args.bf16,
        params_dtype=args.params_dtype,
        pipeline_dtype=args.params_dtype,
        use_cpu_initialization=True,
        # False only from `gigatron estimate`, which builds the model on meta for its shapes
        perform_initialization=getattr(args, "perform_initialization", True),
        transformer_impl="local",
        cross_entropy_loss_fusion=args.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=args.cross_entropy_fusion_impl,
        tp_comm_overlap=args.tp_comm_overlap,
        gradient_accumulation_fusion=getattr(args, "gradient_accumulation_fusion", True),
        wgrad_gemm_accum_fp32=getattr(args, "wgrad_gemm_accum_fp32", True),
        deterministic_mode=getattr(args, "deterministic_mode", False),
    )
    if getattr(args, "attention_backend", None) is not None:
        kw["attention_backend"] = args.attention_backend
    if getattr(args, "apply_query_key_layer_scaling", False):  # Megatron: softmax in fp32 too
        kw.update(apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True)
    if getattr(args, "apply_layernorm_1p", False):
        kw["layernorm_zero_centered_gamma"] = True
    if args.num_experts:
        kw.update(
            num_moe_experts=args.num_experts,
            moe_router_topk=args.moe_router_topk,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size,
            moe_aux_loss_coeff=args.moe_aux_loss_coeff,
            moe_token_dispatcher_type=args.moe_token_dispatcher_type,
            moe_grouped_gemm=args.moe_grouped_gemm,
            moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
            moe_router_load_balancing_type=args.moe_router_load_balancing_type,
            moe_z_loss_coeff=args.moe_z_loss_coeff,
            moe_router_pre_softmax=args.moe_router_pre_softmax,
            moe_layer_freq=getattr(args, "moe_layer_freq", 1),
            moe_expert_capacity_factor=getattr(args, "moe_expert_capacity_factor", None),
            moe_pad_expert_input_to_capacity=bool(
                getattr(args, "moe_pad_expert_input_to_capacity", False)
            ),
            moe_token_drop_policy=getattr(args, "moe_token_drop_policy", "probs"),
        )
        for name in _MOE_ROUTER_FIELDS:  # given by the compat flags; defaults equal the config's
            if hasattr(args, name):
                kw[name] = getattr(args, name)
    if getattr(args, "multi_latent_attention", False):
        config_class = MLATransformerConfig if config_class is TransformerConfig else config_class
        kw.update(_mla_kwargs(args))
    if args.context_parallel_size > 1:
        kw["cp_comm_type"] = args.cp_comm_type
    if getattr(args, "fp8", None) is not None:
        for name in _FP8_FIELDS:
            kw[name] = getattr(args, name)
    return config_class(**kw)


def ddp_config_from_args(args):

    kw = dict(
        grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32 or args.bf16,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=args.use_distributed_optimizer,
    )
    if args.ddp_bucket_size is not None:
        kw["bucket_size"] = args.ddp_bucket_size
    return DistributedDataParallelConfig(**kw)


def optimizer_config_from_args(args):

    return OptimizerConfig(
        optimizer=args.optimizer,
        lr=args.lr,
        min_lr=args.min_lr,
        weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_eps=args.adam_eps,
        sgd_momentum=args.sgd_momentum,
        fp16=args.fp16,
        bf16=args.bf16,
        params_dtype=args.params_dtype,
        loss_scale=args.loss_scale,
        initial_loss_scale=args.initial_loss_scale,
        clip_grad=args.clip_grad,
        use_distributed_optimizer=args.use_distributed_optimizer,
        log_num_zeros_in_grad=bool(getattr(args, "log_num_zeros_in_grad", False)),
        hysteresis=getattr(args, "hysteresis", 2),
        loss_scale_window=getattr(args, "loss_scale_window", 1000),
        min_loss_scale=getattr(args, "min_loss_scale", 1.0),
        flat_adam_step=getattr(args, "flat_adam_step", None),
        sync_free_step=getattr(args, "sync_free_step", False),
    )


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
        min_lr=args.min_lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay if start_wd is None else start_wd,
        end_wd=args.weight_decay if end_wd is None else end_wd,
        wd_incr_steps=wd_incr_steps,
        wd_incr_style=getattr(args, "weight_decay_incr_style", "constant"),
        wsd_decay_steps=wsd_steps or None,
        lr_wsd_decay_style=args.lr_wsd_decay_style,
        # resuming: the saved schedule must match these values unless one of the two flags
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler,
    )


def model_dtype(args) -> torch.dtype:
    return args.params_dtype
