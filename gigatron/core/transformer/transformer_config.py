"""TransformerConfig: the architecture, initialisation, recompute and MoE settings of a model.

Mirrors `megatron.core.transformer.transformer_config.TransformerConfig` (field names, defaults and
post-init rules). Validation lives in `_config_checks.py`. Fields that exist in Megatron only for
kernels gigatron lacks (FP4, delayed FP8, CUDA graphs) are accepted at their default and rejected
otherwise (`gigatron.compat.megatron_only_fields`); pure speed hints for fused kernels
(`masked_softmax_fusion`, `bias_dropout_fusion`, ...) are accepted and run on the plain path, which
computes the same numbers. Unknown keywords raise one `TypeError` naming each of them with the
field to use (`gigatron.compat.missing_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F

from gigatron.compat import megatron_only_fields, missing_names
from gigatron.core.fp8_utils import check_fp8_config
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.transformer import _config_checks
from gigatron.core.transformer.enums import AttnBackend


@missing_names.hint_unknown_fields
@dataclass(kw_only=True)
class TransformerConfig(ModelParallelConfig, megatron_only_fields.MegatronOnlyTransformerFields):
    """Transformer settings (Megatron's names and defaults; dropout is on by default).

    Megatron's fields for features gigatron lacks (delayed FP8, CUDA-graph knobs, Mamba, DSA,
    DeepEP, ...) come from `MegatronOnlyTransformerFields` and must stay at their defaults.
    """

    # ---- architecture ----
    num_layers: int = 0
    """Number of transformer layers (all pipeline stages together)."""
    hidden_size: int = 0
    """Transformer hidden size h."""
    num_attention_heads: int = 0
    """Number of query heads."""
    num_query_groups: int | None = None
    """Number of key/value heads (GQA); None = num_attention_heads (MHA), 1 = MQA."""
    ffn_hidden_size: int | None = None
    """MLP hidden size; None = 4 * hidden_size."""
    kv_channels: int | None = None
    """Head dimension; None = hidden_size // num_attention_heads."""
    hidden_dropout: float = 0.1
    """Dropout after the attention and MLP blocks (and on embeddings)."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities."""
    fp32_residual_connection: bool = False
    """Keep the residual stream in fp32."""
    apply_residual_connection_post_layernorm: bool = False
    """Residual taken after the layer norm instead of before (BERT style)."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of LayerNorm / RMSNorm."""
    layernorm_zero_centered_gamma: bool = False
    """Store the norm weight as (gamma - 1), initialised to zero."""
    add_bias_linear: bool = True
    """Bias on every linear layer (attention and MLP)."""
    add_qkv_bias: bool = False
    """Bias on the fused QKV projection only (Qwen style); add_bias_linear implies it."""
    gated_linear_unit: bool = False
    """GLU MLP: fc1 produces [gate; up] and the output is act(gate) * up."""
    activation_func: Callable = F.gelu
    """MLP activation (F.silu with gated_linear_unit = SwiGLU)."""
    glu_linear_offset: float = 0.0
    """Offset added to the linear half of a GLU: act(gate) * (up + offset)."""
    normalization: str = "LayerNorm"
    """'LayerNorm' or 'RMSNorm'."""
    qk_layernorm: bool = False
    """Normalise queries and keys per head before attention."""
    softmax_scale: float | None = None
    """Attention softmax scale; None = 1/sqrt(kv_channels) (Gemma: query_pre_attn_scalar**-0.5)."""
    window_size: tuple[int, int] | None = None
    """Sliding-window attention (left, right): query i sees keys i - left .. i + right (-1 =
    unbounded; causal masks cap right at 0); None = full attention."""
    window_attn_skip_freq: int | list[int] | None = None
    """Which layers use window_size: None = all; k = all but every k-th (layer_number % k == 0
    is global); a list = one 0/1 per layer (1 = sliding window)."""
    rotary_base_local: float | None = None
    """gigatron (Megatron-Bridge's Gemma 3 provider: rotary_base=(local, global)): RoPE base of
    the sliding-window layers, without the model's RoPE scaling; None = the model's RoPE."""
    attn_logit_softcapping: float | None = None
    """Cap attention scores as cap * tanh(scores / cap) after scaling, before the mask (Gemma 2;
    Megatron-Bridge's name); None = off."""
    final_logit_softcapping: float | None = None
    """Cap output logits as cap * tanh(logits / cap) (Gemma 2; Megatron-Bridge's name)."""
    post_self_attn_layernorm: bool = False
    """gigatron (Megatron-Bridge's Gemma layer submodule): normalise the attention output before
    its residual add (Gemma 2/3 sandwich norm); TransformerLayer builds the config's norm."""
    post_mlp_layernorm: bool = False
    """gigatron (Megatron-Bridge's Gemma layer submodule): normalise the MLP output before its
    residual add."""
    apply_embedding_scaling: bool = False
    """gigatron (Megatron-Bridge's Gemma embedding mixin): multiply the word embeddings by
    sqrt(hidden_size), rounded to their dtype, as Gemma does."""
    attention_backend: AttnBackend = AttnBackend.auto
    """Core attention implementation picked by the specs (local = DotProductAttention)."""
    rotary_interleaved: bool = False
    """Rotate interleaved (even, odd) pairs instead of the two halves of the head dimension."""
    test_mode: bool = False
    """Megatron's test switch (unused)."""
    calculate_per_token_loss: bool = False
    """Schedules divide by the token count instead of the microbatch count."""
    transformer_impl: str = "transformer_engine"
    """'local', 'transformer_engine' (gigatron: the fast spec) or 'inference_optimized'."""

    # ---- initialisation ----
    init_method: Callable | None = None
    """Init of ordinary weights; None = N(0, init_method_std)."""
    output_layer_init_method: Callable | None = None
    """Init of linear_proj / linear_fc2; None = N(0, init_method_std / sqrt(2 * num_layers))."""
    init_method_std: float = 0.02
    """Standard deviation of the default init methods."""
    embedding_init_method: Callable | None = None
    """Init of embeddings; None = N(0, embedding_init_method_std or init_method_std)."""
    embedding_init_method_std: float | None = None
    """Standard deviation of the default embedding init (None = init_method_std)."""

    # ---- numerics and fusion hints ----
    apply_query_key_layer_scaling: bool = False
    """Scale q.k by 1/layer_number and undo it inside the fp32 softmax."""
    attention_softmax_in_fp32: bool = True
    """Compute the attention softmax in fp32."""
    bias_activation_fusion: bool = False
    """Fused bias + activation (speed hint; same numbers on the plain path)."""
    masked_softmax_fusion: bool = False
    """Fused scale-mask-softmax (speed hint)."""
    persist_layer_norm: bool = False
    """Persistent LayerNorm kernel (speed hint)."""
    memory_efficient_layer_norm: bool = False
    """Memory-efficient LayerNorm kernel (speed hint)."""
    bias_dropout_fusion: bool = False
    """Fused bias + dropout + add (speed hint)."""
    apply_rope_fusion: bool = False
    """Fused RoPE kernel (speed hint)."""

    # ---- hybrid models: Mamba-2 layers (gigatron.core.ssm) ----
    is_hybrid_model: bool = False
    """The model mixes Mamba / attention / MLP layers by a hybrid layer pattern."""
    mamba_state_dim: int = 128
    """SSM state size n of the Mamba-2 layers."""
    mamba_head_dim: int = 64
    """Head dimension p of the Mamba-2 layers."""
    mamba_num_groups: int = 8
    """Number of B/C groups g of the Mamba-2 layers (heads share B and C within a group)."""
    mamba_num_heads: int | None = None
    """Number of Mamba-2 heads; None = 2 * hidden_size // mamba_head_dim (expand 2)."""
    use_mamba_mem_eff_path: bool = True
    """Megatron's fused-kernel switch; gigatron's one pure-PyTorch path computes the same math
    either way (speed hint)."""

    # ---- activation recompute ----
    recompute_granularity: str | None = None
    """None, 'full' (whole layers) or 'selective' (the modules in recompute_modules)."""
    recompute_method: str | None = None
    """'uniform' (chunks of recompute_num_layers) or 'block' (first N layers); full only."""
    recompute_num_layers: int | None = None
    """Layers per recompute chunk (uniform) or recomputed layers per stage (block)."""
    distribute_saved_activations: bool = False
    """Store recompute inputs split across TP ranks."""
    recompute_modules: list[str] | None = None
    """Modules recomputed under 'selective'; None = ['core_attn']. gigatron: core_attn, mlp."""

    # ---- pipeline split ----
    num_layers_in_first_pipeline_stage: int | None = None
    """Layers on the first stage when the split is uneven (not supported)."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Layers on the last stage when the split is uneven (not supported)."""
    pipeline_model_parallel_layout: object | None = None
    """Explicit per-stage layer layout (not supported)."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as a layer when splitting (not supported)."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the loss as a layer when splitting (not supported)."""

    # ---- MoE (used by the MoE issue) ----
    num_moe_experts: int | None = None
    """Number of experts; None = dense model."""
    moe_layer_freq: int | list[int] = 1
    """MoE on every k-th layer (int) or per-layer 0/1 pattern (list)."""
    moe_ffn_hidden_size: int | None = None
    """Expert MLP hidden size; None = ffn_hidden_size."""
    moe_shared_expert_intermediate_size: int | None = None
    """Hidden size of the shared experts (None = no shared experts)."""
    moe_shared_expert_gate: bool = False
    """Scale the shared experts' output per token by sigmoid(x @ w), w [1, h] (Qwen2-MoE);
    only with moe_shared_expert_intermediate_size."""
    moe_shared_expert_overlap: bool = False
    """Overlap shared-expert compute with dispatch."""
    moe_router_load_balancing_type: str | list[str] = "aux_loss"
    """'aux_loss', 'seq_aux_loss', 'global_aux_loss', 'sinkhorn' or 'none'."""
    moe_router_topk: int = 2
    """Experts per token."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before top-k (default: softmax over the k selected)."""
    moe_router_num_groups: int | None = None
    """Expert groups for group-limited routing."""
    moe_router_group_topk: int | None = None
    """Groups selected per token for group-limited routing."""
    moe_router_topk_scaling_factor: float | None = None
    """Scale applied to the top-k routing weights."""
    moe_router_score_function: str = "softmax"
    """'softmax', 'sigmoid' or 'sqrtsoftplus'."""
    moe_router_dtype: str | None = None
    """Router compute dtype: None, 'fp32' or 'fp64'."""
    moe_router_enable_expert_bias: bool = False
    """Aux-loss-free expert bias (sigmoid scores)."""
    moe_router_bias_update_rate: float = 1e-3
    """Update rate of the expert bias."""
    moe_grouped_gemm: bool = False
    """Run local experts as one grouped GEMM."""
    moe_aux_loss_coeff: float | list[float] = 0.0
    """Load-balancing loss coefficient."""
    moe_z_loss_coeff: float | None = None
    """Router z-loss coefficient."""
    moe_input_jitter_eps: float | None = None
    """Multiplicative input jitter for the router."""
    moe_token_dispatcher_type: str = "allgather"
    """'allgather', 'alltoall' or 'flex'."""
    moe_expert_capacity_factor: float | None = None
    """Capacity factor (None = dropless)."""
    moe_pad_expert_input_to_capacity: bool = False
    """Pad each expert's input to its capacity."""
    moe_token_drop_policy: str = "probs"
    """'probs' or 'position': which tokens are dropped over capacity."""
    moe_permute_fusion: bool = False
    """Fused permutation kernels (speed hint)."""
    moe_router_fusion: bool = False
    """Fused router kernels (speed hint)."""
    moe_layer_recompute: bool = False
    """Recompute whole MoE layers."""
    moe_per_layer_logging: bool = False
    """Log MoE statistics per layer."""
    moe_router_force_load_balancing: bool = False
    """Benchmarks: route on random normal logits (each rank its own expert-parallel RNG stream);
    the gradient passes straight through to the gate's logits."""

    # ---- FP8 (gigatron's own linears through torchao; docs/fp8.md) ----
    fp8: str | None = None
    """FP8 GEMMs in the transformer layers' linears: 'e4m3' (gradients too) or 'hybrid' (e5m2
    gradients); None: off. Needs the `fp8` extra (torchao)."""
    fp8_recipe: str = "delayed"
    """Scaling recipe: 'delayed' (Megatron's default: scales from an amax history, TE's
    DelayedScaling), 'tensorwise', 'rowwise' or 'rowwise_with_gw_hp' (current scaling);
    'mxfp8' / 'blockwise' / 'custom' raise when fp8 is set."""
    fp8_margin: int = 0
    """Scales are divided by 2**fp8_margin (headroom above the amax)."""
    fp8_interval: int = 1
    """Deprecated (ignored by Transformer Engine >= 1.8, a warning when not 1): scales are
    updated after every forward and backward."""
    fp8_amax_history_len: int = 1
    """Delayed scaling: amaxes kept per tensor (the window the scale is computed over)."""
    fp8_amax_compute_algo: str = "most_recent"
    """Delayed scaling: the amax a scale comes from, 'max' over the history or 'most_recent'."""
    tp_only_amax_red: bool = False
    """Delayed scaling: reduce amaxes over TP (x CP) only instead of TP x DP x CP."""
    fp8_wgrad: bool = True
    """Weight-gradient GEMM in FP8; False keeps it in the model dtype."""
    first_last_layers_bf16: bool = False
    """Keep the first / last transformer layers out of FP8 (counts below)."""
    num_layers_at_start_in_bf16: int = 1
    """Layers at the start kept in high precision under first_last_layers_bf16."""
    num_layers_at_end_in_bf16: int = 1
    """Layers at the end kept in high precision under first_last_layers_bf16."""

    # ---- multi-token prediction (DeepSeek-V3; multi_token_prediction.py) ----
    mtp_num_layers: int | None = None
    """Multi-token-prediction depths D: D sequential modules predict D more tokens per
    position (None or 0: no MTP)."""
    mtp_loss_scaling_factor: float | None = 0.1
    """Weight of the MTP loss: the mean of the D depths' losses times this factor is added to
    the training objective."""
    mtp_use_repeated_layer: bool = False
    """Build one MTP layer and apply it at every depth instead of D layers."""
    mtp_detach_heads: bool = False
    """Detach the MTP inputs (hidden states, embeddings, output weight) from the main model:
    the MTP loss trains the MTP layers only."""

    # ---- attention sinks and the clamped GLU (GPT-OSS) ----
    softmax_type: str = "vanilla"
    """'vanilla', 'off-by-one' (a zero sink logit per head in the softmax denominator) or
    'learnable' (a learned sink logit per head, TP-sharded over heads: GPT-OSS)."""
    activation_func_clamp_value: float | None = None
    """GLU clamp: gate clamped to <= value, linear half to [-value, value] before the
    activation (GPT-OSS's clamped SwiGLU; with silu, MoE only, as in Megatron)."""

    # ---- YaRN positions of GPTModel(position_embedding_type="yarn") (GPT-OSS) ----
    # Megatron's GPTModel reads these off the config (set by its training arguments or the
    # GPT-OSS builder, not declared fields); gigatron declares them with those defaults.
    yarn_rotary_scaling_factor: float = 1.0
    """YaRN context extension factor; the attention multiplies cos/sin by its concentration
    factor (1 at 1.0, so the default changes nothing)."""
    yarn_original_max_position_embeddings: int = 4096
    """YaRN: context length of the unscaled model."""
    yarn_beta_fast: float = 32.0
    """YaRN: channels turning more than beta_fast times over the original context are kept."""
    yarn_beta_slow: float = 1.0
    """YaRN: channels turning fewer than beta_slow times are divided by the factor."""
    yarn_mscale: float = 1.0
    """YaRN concentration factor numerator's mscale."""
    yarn_mscale_all_dim: float = 0.0
    """YaRN concentration factor denominator's mscale."""
    yarn_correction_range_round_to_int: bool = True
    """Round the YaRN ramp's channel bounds outward to integers (GPT-OSS: False)."""

    # ---- Megatron features gigatron does not implement (must stay at the default) ----
    fp8_param: bool = False
    """Keep parameters in FP8 (Transformer Engine only)."""
    fp4: str | None = None
    """FP4 training (Transformer Engine only)."""
    multi_latent_attention: bool = False
    """DeepSeek multi-latent attention: set by MLATransformerConfig (whose fields it needs)."""
    no_rope_freq: int | list[int] | None = None
    """NoPE layers: k -> every k-th layer skips RoPE; or one 0/1 per layer (1 = no RoPE)."""
    qk_l2_norm: bool = False
    """L2-normalise q and k (not implemented)."""
    attention_output_gate: bool = False
    """Gated attention output (not implemented)."""
    experimental_attention_variant: str | None = None
    """Gated delta net / DSA attention variants (not implemented)."""
    enable_cuda_graph: bool = False
    """CUDA graphs (not implemented)."""
    cuda_graph_impl: str = "none"
    """CUDA graph implementation (only 'none')."""
    cp_comm_type: str | list[str] | None = None
    """Context-parallel attention: "p2p" (ring; None means "p2p"), "all_gather" or "a2a", or a list
    with one per layer; "a2a+p2p" is refused (gigatron.core.transformer.context_parallel)."""
    use_kitchen: bool = False
    """NVIDIA kitchen quantisation (not implemented)."""
    init_model_with_meta_device: bool = False
    """Build parameters on the meta device (not implemented)."""
    use_te_rng_tracker: bool = False
    """Transformer Engine RNG tracker (not available)."""
    moe_latent_size: int | None = None
    """Latent MoE projection (not implemented)."""
    clone_scatter_output_in_embedding: bool = True
    """Clone the SP-scattered embedding output so its buffer can be freed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _config_checks.check_clamped_swiglu_te(self)
        megatron_only_fields.check_config(self, "transformer")
        _config_checks.check_architecture(self)
        _config_checks.check_value_ranges(self)
        _config_checks.fill_defaults(self)
        _config_checks.check_recompute(self)
        _config_checks.check_pipeline(self)
        _config_checks.check_context_parallel(self)
        _config_checks.expand_no_rope_freq(self)
        _config_checks.check_attention_variants(self)
        check_fp8_config(self)
        if self.multi_latent_attention and not isinstance(self, MLATransformerConfig):
            raise ValueError(
                "multi_latent_attention=True needs MLATransformerConfig (its q_lora_rank, "
                "kv_lora_rank, head dims and RoPE fields); TransformerConfig has none"
            )


@dataclass(kw_only=True)
class MLATransformerConfig(TransformerConfig):
    """TransformerConfig of a multi-latent-attention model (DeepSeek-V2/V3): Megatron's fields
    and defaults, including the RoPE of MLA's own rotary embedding ('rope' or YaRN)."""

    multi_latent_attention: bool = True
    """Use MultiLatentAttention (the MLA specs)."""
    q_lora_rank: int | None = 512
    """Rank of the query down-projection; None = one full-rank query projection."""
    kv_lora_rank: int = 512
    """Rank of the shared key/value latent."""
    qk_head_dim: int = 128
    """Per-head query/key dim without RoPE (q head dim = qk_head_dim + qk_pos_emb_head_dim)."""
    qk_pos_emb_head_dim: int = 64
    """Per-head dim of the rotary part of queries and of the one shared rotary key."""
    v_head_dim: int = 128
    """Per-head value dim."""
    normalization: str = "RMSNorm"
    """MLA models default to RMSNorm."""
    rope_type: str = "yarn"
    """'rope' (plain) or 'yarn' (DeepSeek's long-context scaling)."""
    rotary_base: float = 10000
    """RoPE base (both types)."""
    rotary_percent: float = 1.0
    """Fraction of qk_pos_emb_head_dim rotated ('rope')."""
    rotary_scaling_factor: float = 40
    """YaRN scaling factor (context extension ratio)."""
    original_max_position_embeddings: int = 4096
    """YaRN: context length of the unscaled model."""
    beta_fast: float = 32
    """YaRN: rotations above which a frequency is kept (extrapolated)."""
    beta_slow: float = 1
    """YaRN: rotations below which a frequency is interpolated."""
    mscale: float = 1.0
    """YaRN: cos/sin are multiplied by mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""
    mscale_all_dim: float = 0.0
    """YaRN: the softmax scale is multiplied by mscale(factor, mscale_all_dim)**2."""
    cache_mla_latents: bool = False
    """Cache the latents instead of K/V (Flash MLA dynamic inference; not supported)."""
    mla_down_proj_fusion: bool = False
    """Fused q/kv down-projection kernels (Transformer Engine; not supported)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _config_checks.check_mla(self)
