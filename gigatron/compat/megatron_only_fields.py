"""Megatron config fields for features gigatron does not implement, accepted only at the default.

megatron-core's `ModelParallelConfig`, `TransformerConfig` and `OptimizerConfig` carry fields for
Transformer Engine (FP4, FP8 attention / parameters / delayed scaling, userbuffer overlap), CUDA
graphs, Mamba / hybrid models, attention variants, DeepEP, inference kernels and offloading. A
Megatron script or config file that spells them out at their default values must construct
unchanged, and any other value must fail loudly (a setting is never silently ignored).
Two kinds, one rule:

- fields gigatron's configs do not otherwise need: declared here as mixins (`PARALLEL`,
  `TRANSFORMER`, `OPTIMIZER`; names of megatron-core 0.16.1, then those 0.19.2 and 0.20 added;
  the newest defaults). Where a release changed a default, the older ones are accepted as well
  (`OLDER_DEFAULTS`);
- fields the configs declare themselves, because code reads them (`fp8_param`,
  `enable_cuda_graph`, ...): only the reason lives here (`DECLARED_PARALLEL`,
  `DECLARED_TRANSFORMER`), the default is the config's.

Each config's `__post_init__` makes one call, `check_config(self, "<kind>")`, which raises
ValueError naming the field, its value and why. `RESTRICTED` lists fields accepted with only some
of Megatron's values (the config checks them; docs/compat.md lists them as partial).

Leaf module: imports nothing from gigatron (see `gigatron.compat`).
"""

from __future__ import annotations

from dataclasses import MISSING, field, fields, make_dataclass

_TE = "needs Transformer Engine (FP4 / FP8 attention / userbuffers / TE modules)"
_EP_OVERLAP = "EP all-to-all / weight-gradient overlap is not implemented"
_OFFLOAD = "CPU / activation offloading is not implemented"
_ATTN = "this attention variant (QK-clip, NoPE, DSA, gated delta net, mRoPE) is not implemented"
_MOE = (
    "this MoE feature (routing replay, device-limited routing, DeepEP / "
    "HybridEP) is not implemented"
)
_GRAPH = "CUDA graphs are not implemented"
_INFER = (
    "inference-engine kernels (flash decode, batch-invariant mode, fused TP) are not implemented"
)
_HYBRID = "Mamba / hybrid / heterogeneous models are not implemented"
_GTP = "GTP weight sharding / rematerialisation is not implemented"
_MTP = "hidden-state mixing / hybrid-pattern MTP is not implemented"
_MUP = "muP parametrisation is not implemented"
_MHC = "mHC (manifold-constrained hyper-connection) residual streams are not implemented"
_GDP = "Gated DeltaProduct layers are not implemented"

# name -> (Megatron's default, why gigatron refuses another value)
PARALLEL: dict[str, tuple[object, str]] = {
    "pipeline_model_parallel_comm_backend": (None, "the UCC pipeline backend is not implemented"),
    "max_seqlen_per_dp_cp_rank": (None, "hybrid context parallel is not implemented"),
    "use_te_rng_tracker": (False, _TE),
    "tp_comm_bulk_wgrad": (True, _TE),
    "tp_comm_bulk_dgrad": (True, _TE),
    "tp_comm_overlap_ag": (True, _TE),
    "tp_comm_overlap_rs": (True, _TE),
    "tp_comm_overlap_rs_dgrad": (False, _TE),
    "tp_comm_split_ag": (True, _TE),
    "tp_comm_atomic_ag": (False, _TE),
    "tp_comm_split_rs": (True, _TE),
    "tp_comm_atomic_rs": (False, _TE),
    "tp_comm_overlap_disable_qkv": (False, _TE),
    "tp_comm_overlap_disable_fc1": (False, _TE),
    "tp_comm_bootstrap_backend": ("nccl", _TE),
    "overlap_moe_expert_parallel_comm": (False, _EP_OVERLAP),
    "delay_wgrad_compute": (False, _EP_OVERLAP),
    "ep_overlap_early_attn_memory_release": (False, _EP_OVERLAP),
    "overlap_p2p_comm_warmup_flush": (False, "p2p warm-up flush overlap is not implemented"),
    "cpu_offloading_num_layers": (0, _OFFLOAD),
    "cpu_offloading_activations": (True, _OFFLOAD),
    "cpu_offloading_weights": (False, _OFFLOAD),
    "cpu_offloading_double_buffering": (False, _OFFLOAD),
    # added in megatron-core 0.19
    "tensor_parallel_num_weight_shards": (None, _GTP),
    "gtp_weight_remat_size": (1, _GTP),
    "expert_tensor_parallel_num_weight_shards": (None, _GTP),
    "expert_gtp_weight_remat_size": (1, _GTP),
    "moe_grad_scale_func": (None, "the MoE grad-scale hook is not implemented"),
    "overlap_dispatch_backward_with_experts_wgrad": (False, _EP_OVERLAP),
    "_cpu_offloading_context": (None, _OFFLOAD),
    "cpu_offloading_retain_pinned_cpu_buffers": (False, _OFFLOAD),
}

TRANSFORMER: dict[str, tuple[object, str]] = {
    "activation_func_fp8_input_store": (False, _TE),
    "qk_clip": (False, _ATTN),
    "qk_clip_alpha": (0.5, _ATTN),
    "qk_clip_threshold": (100, _ATTN),
    "log_max_attention_logit": (False, _ATTN),
    "dsa_indexer_n_heads": (None, _ATTN),
    "dsa_indexer_head_dim": (None, _ATTN),
    "dsa_indexer_topk": (None, _ATTN),
    "dsa_indexer_loss_coeff": (None, _ATTN),
    "dsa_indexer_use_sparse_loss": (False, _ATTN),
    "linear_attention_freq": (None, _ATTN),
    "linear_conv_kernel_dim": (4, _ATTN),
    "linear_key_head_dim": (128, _ATTN),
    "linear_value_head_dim": (128, _ATTN),
    "linear_num_key_heads": (16, _ATTN),
    "linear_num_value_heads": (32, _ATTN),
    "mrope_section": (None, _ATTN),
    "disable_bf16_reduced_precision_matmul": (False, _TE),
    "use_fused_weighted_squared_relu": (False, _TE),
    "fused_single_qkv_rope": (False, _TE),
    "fp8_quantizer_factory": (None, _TE),
    "fp8_dot_product_attention": (False, _TE),
    "fp8_multi_head_attention": (False, _TE),
    "use_kitchen_attention": (False, "kitchen quantisation is not implemented"),
    "kitchen_attention_backend": ("sdpa", "kitchen quantisation is not implemented"),
    "fp4_recipe": ("nvfp4", _TE),
    "fp4_param": (False, _TE),
    "fp4_quantizer_factory": (None, _TE),
    "moe_enable_routing_replay": (False, _MOE),
    "moe_router_topk_limited_devices": (None, _MOE),
    "moe_router_padding_for_quantization": (False, _TE),
    "moe_router_padding_for_fp8": (False, _TE),
    "moe_use_legacy_grouped_gemm": (False, "the legacy grouped_gemm package is not used"),
    "moe_token_dropping": (False, _MOE),
    "moe_enable_deepep": (False, _MOE),
    "moe_flex_dispatcher_backend": ("deepep", _MOE),
    "moe_apply_probs_on_input": (False, _MOE),
    "moe_deepep_num_sms": (None, _MOE),
    "moe_hybridep_num_sms": (None, _MOE),
    "cuda_graph_use_single_mempool": (True, _GRAPH),
    "cuda_graph_retain_backward_graph": (False, _GRAPH),
    "cuda_graph_warmup_steps": (3, _GRAPH),
    "external_cuda_graph": (False, _GRAPH),
    "cuda_graph_scope": (None, _GRAPH),
    "disable_parameter_transpose_cache": (False, _TE),
    "config_logger_dir": ("", "Megatron's config dump directory is not implemented"),
    "flash_decode": (False, _INFER),
    "batch_invariant_mode": (False, _INFER),
    "use_te_activation_func": (False, _TE),
    "inference_rng_tracker": (False, _INFER),
    "inference_sampling_seed": (42, _INFER),
    "symmetric_ar_type": (None, _INFER),
    "use_inference_optimized_layers": (False, _INFER),
    "inference_fuse_tp_communication": (False, _INFER),
    "mlp_chunks_for_prefill": (1, _INFER),
    "heterogeneous_block_specs": (False, _HYBRID),
    "hetereogenous_dist_checkpoint": (False, _HYBRID),
    "quant_recipe": (None, _TE),
    "fine_grained_activation_offloading": (False, _OFFLOAD),
    "offload_modules": ([], _OFFLOAD),
    "min_offloaded_tensor_size": (1024 * 1024, _OFFLOAD),
    # added in megatron-core 0.19
    "mtp_hybrid_override_pattern": (None, _MTP),
    "flash_attention_version": (None, "gigatron's attention is torch SDPA; no flash-attn package"),
    "experimental_attention_variant_loss_scale_func": (None, _ATTN),
    "dsa_indexer_topk_freq": (1, _ATTN),
    "dsa_indexer_skip_topk_offset": (0, _ATTN),
    "dsa_kernel_backend": ("none", _ATTN),
    "dsa_indexer_rope_interleaved": (False, _ATTN),
    "dsa_indexer_rotate_activation": (True, _ATTN),
    "dsa_indexer_scoring_relu": (True, _ATTN),
    "dsa_indexer_k_norm_epsilon": (None, _ATTN),
    "dsa_indexer_k_norm_fp32": (False, _ATTN),
    "use_mup": (False, _MUP),
    "mup_width_mult": (1.0, _MUP),
    "mup_base_hidden_size": (None, _MUP),
    "mup_embedding_mult": (1.0, _MUP),
    "mup_output_mult": (1.0, _MUP),
    "mup_base_head_dim": (None, _MUP),
    "mup_attn_scale_power": (1.0, _MUP),
    "fused_residual_rmsnorm": (False, _TE),
    "use_transformer_engine_op_fuser": (False, _TE),
    "fp8_output_proj": (False, _TE),
    "high_priority_a2a_comm_stream": (False, _EP_OVERLAP),
    "use_grouped_gemm_for_shared_expert": (False, _MOE),
    "moe_shared_expert_glu_interleave_size": (None, _MOE),
    "moe_router_quantile_balancing_ema": (0.0, _MOE),
    "moe_router_force_biased": (None, _MOE),
    "use_grouped_gemm_for_dense_mlp": (False, _MOE),
    "moe_single_grouped_weight": (False, _MOE),
    "moe_single_grouped_bias": (False, _MOE),
    "moe_permute_fusion_into_hybridep": (False, _MOE),
    "moe_hybridep_pad_uneven_dispatch_inputs": (False, _MOE),
    "moe_pad_experts_for_cuda_graph_inference": (False, _GRAPH),
    "moe_flex_dispatcher_num_sms": (None, _MOE),
    "moe_hybridep_num_blocks_permute": (None, _MOE),
    "moe_hybridep_num_blocks_unpermute": (None, _MOE),
    "moe_hybridep_num_sms_preprocessing": (108, _MOE),
    "moe_ncclep_static_shape": (False, _MOE),
    "moe_ncclep_zero_copy": (False, _MOE),
    "moe_mlp_glu_interleave_size": (None, _MOE),
    "moe_expert_rank_capacity_factor": (None, _MOE),
    "cuda_graph_modules": ("full", _GRAPH),
    "inference_cuda_graph_scope": (None, _INFER),
    "nccl_all_reduce_for_prefill": (False, _INFER),
    "inference_disable_triton_nvls_kernels": (False, _INFER),
    "inference_grouped_gemm_backend": ("vllm", _INFER),
    "inference_moe_disable_fused_quant_kernels": (False, _INFER),
    "inference_moe_token_dispatcher_type": ("nvls", _INFER),
    "mamba_training_ssm_states_dtype": (None, _HYBRID),
    "mlp_chunks_for_training": (1, "chunked MLP execution is not implemented"),
    "delay_offload_until_cuda_graph": (False, _OFFLOAD),
    "delta_offload_bytes_across_pp_ranks": (0, _OFFLOAD),
    "activation_offload_fraction": (1.0, _OFFLOAD),
    "moe_paged_stash": (False, _OFFLOAD),
    "moe_paged_stash_page_size": (64, _OFFLOAD),
    "moe_paged_stash_buffer_size_factor_cuda": (1.1, _OFFLOAD),
    "moe_paged_stash_buffer_size_factor_cpu": (0.0, _OFFLOAD),
    "fine_grained_offloading_max_inflight_offloads": (None, _OFFLOAD),
    # added in megatron-core 0.20
    "mtp_hsm": (False, _MTP),
    "moe_use_grouped_tensor": (False, _TE),
    "gtp_remat_opt_in_modules": ([], _GTP),
    "moe_dispatch_fwd_dtype": ("bf16", "MXFP8 MoE dispatch / combine payloads need TE"),
    "moe_combine_bwd_dtype": ("bf16", "MXFP8 MoE dispatch / combine payloads need TE"),
    "enable_mhc_connections": (False, _MHC),
    "mhc_num_residual_streams": (4, _MHC),
    "mhc_sinkhorn_iterations": (20, _MHC),
    "mhc_init_gating_factor": (0.01, _MHC),
    "mhc_recompute_layer_num": (None, _MHC),
    "batch_invariant_backend": ("te_native", _INFER),
    "gdp_num_householder": (3, _GDP),
    "gdp_cutedsl_kernel": (False, _GDP),
    "gdp_num_chunk_states_to_recompute": (2, _GDP),
}

# Older releases' defaults where a newer one changed them (the tables hold the newest): accepted
# as well (inert without the feature, which gigatron refuses at any non-default value).
# 0.16's where 0.19 changed them.
OLDER_DEFAULTS: dict[str, tuple[object, ...]] = {
    "cuda_graph_scope": ("full",),
    "cuda_graph_use_single_mempool": (False,),
    "moe_deepep_num_sms": (20,),
    "moe_hybridep_num_sms": (16,),
}


def _mixin(name: str, table: dict[str, tuple[object, str]]):
    specs = []
    for field_name, (default, _) in table.items():
        if isinstance(default, list):  # mutable: a fresh copy per config, as Megatron's factory
            spec = field(default_factory=list(default).copy)
        else:
            spec = field(default=default)
        specs.append((field_name, object, spec))
    return make_dataclass(name, specs, kw_only=True)


_ADAPTIVE_MUON = "the Adaptive Muon optimizer is not implemented"
# OptimizerConfig (megatron.core.optimizer.optimizer_config)
OPTIMIZER: dict[str, tuple[object, str]] = {
    "fp8_recipe": (None, _TE),
    "reuse_grad_buf_for_mxfp8_param_ag": (False, _TE),
    # added in megatron-core 0.19
    "soap_shampoo_beta": (0.95, "the SOAP optimizer is not implemented"),
    "soap_precondition_frequency": (1, "the SOAP optimizer is not implemented"),
    "soap_use_kl_shampoo": (True, "the SOAP optimizer is not implemented"),
    "adaptive_muon_moment2_method": ("adamuon", _ADAPTIVE_MUON),
    "adaptive_muon_beta2": (0.95, _ADAPTIVE_MUON),
    "adaptive_muon_eps": (1e-08, _ADAPTIVE_MUON),
    "use_layer_wise_distributed_optimizer": (
        False,
        "the layer-wise distributed optimizer is not implemented",
    ),
    "grad_norm_skip_threshold": (float("inf"), "skipping steps by grad norm is not implemented"),
    "optimizer_cuda_graph": (False, _GRAPH),
    # added in megatron-core 0.20
    "muon_use_syrk": (False, "the Triton SYRK kernel of Newton-Schulz is not implemented"),
}

MegatronOnlyParallelFields = _mixin("MegatronOnlyParallelFields", PARALLEL)
MegatronOnlyOptimizerFields = _mixin("MegatronOnlyOptimizerFields", OPTIMIZER)
MegatronOnlyTransformerFields = _mixin("MegatronOnlyTransformerFields", TRANSFORMER)


# Fields the configs declare themselves (code reads them), accepted only at the config's default:
# name -> why gigatron refuses another value
DECLARED_PARALLEL: dict[str, str] = {
    "cpu_offloading": "activation CPU offloading is not implemented",
    "use_ring_exchange_p2p": "ring-exchange p2p needs a custom PyTorch build",
    "defer_embedding_wgrad_compute": "deferred embedding wgrad needs gradient_accumulation_fusion",
    "hybrid_context_parallel": "hybrid (dynamic) context parallel is not implemented",
}

DECLARED_TRANSFORMER: dict[str, str] = {
    "fp8_param": "FP8 parameters need Transformer Engine",
    "fp4": "FP4 needs Transformer Engine",
    "qk_l2_norm": "q/k L2 norm is not implemented",
    "attention_output_gate": "gated attention output is not implemented",
    "experimental_attention_variant": "experimental attention variants are not implemented",
    "enable_cuda_graph": "CUDA graphs are not implemented",
    "cuda_graph_impl": "CUDA graphs are not implemented",
    "use_kitchen": "kitchen quantisation is not implemented",
    "init_model_with_meta_device": "meta-device initialisation is not implemented",
    "use_te_rng_tracker": "the Transformer Engine RNG tracker is not available",
    "moe_latent_size": "latent MoE is not implemented",
    "pipeline_model_parallel_layout": "explicit pipeline layouts are not implemented",
}

# Megatron fields accepted with only some of Megatron's values: name -> which
RESTRICTED: dict[str, str] = {
    "fp8": "'e4m3' and 'hybrid', on gigatron's own linears through torchao (docs/fp8.md)",
    "fp8_recipe": "'delayed' (Megatron's default), 'tensorwise' and torchao's 'rowwise' / "
    "'rowwise_with_gw_hp'; 'mxfp8', 'blockwise' and 'custom' raise when fp8 is set",
    "cross_entropy_fusion_impl": "'native' and gigatron's 'native_grad_in_forward'; 'te' "
    "(Transformer Engine) raises",
}

# config kind -> (mixin table, declared table)
TABLES: dict[str, tuple[dict[str, tuple[object, str]], dict[str, str]]] = {
    "parallel": (PARALLEL, DECLARED_PARALLEL),
    "transformer": (TRANSFORMER, DECLARED_TRANSFORMER),
    "optimizer": (OPTIMIZER, {}),
}


def check_config(cfg, kind: str) -> None:
    """ValueError for the first Megatron-only field of `cfg` not at its default.

    kind: "parallel" (ModelParallelConfig), "transformer" (TransformerConfig) or "optimizer"
    (OptimizerConfig); a subclass checks its own kind after its parent's.
    """
    _megatron_value_rules(cfg)
    table, declared = TABLES[kind]
    defaults = {f.name: f.default for f in fields(cfg)}
    for name, (default, why) in table.items():
        if name not in defaults:
            continue
        value = getattr(cfg, name, MISSING)
        if value != default and not any(value == d for d in OLDER_DEFAULTS.get(name, ())):
            raise _refused(name, value, default, why)
    for name, why in declared.items():
        value = getattr(cfg, name)
        if value != defaults[name]:
            raise _refused(name, value, defaults[name], why)


def _refused(name: str, value: object, default: object, why: str) -> ValueError:
    return ValueError(
        f"{name}={value!r} is not supported by gigatron ({why}); leave it at Megatron's "
        f"default {default!r} (docs/compat.md)"
    )


_BATCH_INVARIANT_BACKENDS = ("deepgemm", "triton", "te_native")


def _megatron_value_rules(cfg) -> None:
    """Megatron's own checks on fields gigatron refuses, run first: a value Megatron itself
    rejects gets Megatron's exception type and rule (its tests and users expect them), a legal
    value then gets gigatron's "not supported" refusal."""
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    householder = get("gdp_num_householder", 3)
    if householder < 1:
        raise ValueError(f"gdp_num_householder must be positive, got {householder}.")
    if get("moe_dispatch_fwd_dtype", "bf16") != "bf16" or get("moe_combine_bwd_dtype", "bf16") != (
        "bf16"
    ):
        if get("moe_token_dispatcher_type") != "flex" or get("moe_flex_dispatcher_backend") != (
            "ncclep"
        ):
            raise ValueError(
                "moe_dispatch_fwd_dtype / moe_combine_bwd_dtype require the 'ncclep' flex "
                f"dispatcher backend (got moe_token_dispatcher_type="
                f"{get('moe_token_dispatcher_type')!r}, moe_flex_dispatcher_backend="
                f"{get('moe_flex_dispatcher_backend')!r})"
            )
        if not (get("use_transformer_engine_op_fuser") and get("moe_grouped_gemm")):
            raise ValueError(
                "moe_dispatch_fwd_dtype / moe_combine_bwd_dtype = 'mxfp8' require BOTH "
                "use_transformer_engine_op_fuser and moe_grouped_gemm"
            )
    # Megatron asserts these (AssertionError is the type its tests expect).
    if get("flash_decode") and get("no_rope_freq"):
        raise AssertionError("flash_decode cannot be used with no_rope_freq (NoPE layers)")
    if get("overlap_moe_expert_parallel_comm") and get("mtp_num_layers") not in (None, 0, 1):
        raise AssertionError(
            f"MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm "
            f"(mtp_num_layers={get('mtp_num_layers')!r})"
        )
    if get("batch_invariant_mode") and get("batch_invariant_backend") not in (
        _BATCH_INVARIANT_BACKENDS
    ):
        raise AssertionError(
            f"Unknown batch_invariant_backend {get('batch_invariant_backend')!r}; expected one "
            f"of {_BATCH_INVARIANT_BACKENDS}"
        )
