"""Layer specs for GPTModel (mirrors `megatron.core.models.gpt.gpt_layer_specs`).

`get_gpt_layer_local_spec`: Megatron's local (no Transformer Engine) layer: norms, SelfAttention
(causal) with column/row-parallel projections and DotProductAttention, MLP, bias-dropout-add.
`get_gpt_layer_fast_spec` (gigatron): the same layer and parameter names with the SDPA core
attention; numerically the same model, tested against the local spec.
With `num_experts` the MLP slot holds an MoELayer (`moe_module_specs.get_moe_module_spec`);
`get_gpt_decoder_block_spec` mixes dense and MoE layers by `config.moe_layer_freq`.
`multi_latent_attention=True` puts MLASelfAttention (DeepSeek-V2/V3; docs/mla.md) in the
attention slot of either spec.
"""

from __future__ import annotations

from gigatron.core import tensor_parallel
from gigatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from gigatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.identity_op import IdentityOp
from gigatron.core.transformer.mlp import MLP, MLPSubmodules
from gigatron.core.transformer.multi_latent_attention import (
    MLASelfAttention,
    MLASelfAttentionSubmodules,
)
from gigatron.core.transformer.multi_token_prediction import (
    MultiTokenPredictionBlockSubmodules,
    get_mtp_layer_spec_for_backend,
    get_mtp_num_layers_to_build,
)
from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_block import TransformerBlockSubmodules
from gigatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)

# Local-spec norms are stored under Transformer Engine's fused-layer names in checkpoints.
LOCAL_SHARDED_KEYS_MAP = {
    "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
}


def _check(normalization) -> None:
    if normalization not in (None, "LayerNorm", "RMSNorm"):
        raise ValueError(
            f"normalization ({normalization!r}) must be None, 'LayerNorm' or 'RMSNorm'"
        )


def _refuse(**settings) -> None:
    """ValueError for Megatron spec switches gigatron has no implementation of, when not at
    their default (name -> (value, default))."""
    bad = [f"{n}={v!r}" for n, (v, d) in settings.items() if v != d]
    if bad:
        raise ValueError(
            f"{', '.join(bad)}: not supported by gigatron's layer specs (Transformer Engine / "
            "kitchen / the legacy grouped_gemm package); leave at the default"
        )


def _layer_spec(
    core_attention,
    qk_layernorm: bool,
    num_experts=None,
    moe_grouped_gemm: bool = False,
    attn_mask_type: AttnMaskType = AttnMaskType.causal,
    multi_latent_attention: bool = False,
) -> ModuleSpec:
    """One layer of the local or fast spec (per `core_attention`); BertModel's layer is this
    one with attn_mask_type=AttnMaskType.padding (bert_layer_specs.py)."""
    if multi_latent_attention:
        return _mla_layer_spec(core_attention, qk_layernorm, num_experts, moe_grouped_gemm)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": attn_mask_type},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=tensor_parallel.ColumnParallelLinear,
                    core_attention=core_attention,
                    linear_proj=tensor_parallel.RowParallelLinear,
                    q_layernorm=WrappedTorchNorm if qk_layernorm else IdentityOp,
                    k_layernorm=WrappedTorchNorm if qk_layernorm else IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=get_mlp_module_spec(num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=dict(LOCAL_SHARDED_KEYS_MAP),
        ),
    )


def _mla_layer_spec(core_attention, qk_layernorm, num_experts, moe_grouped_gemm) -> ModuleSpec:
    """Megatron's local MLA layer: MLASelfAttention (causal) with column-parallel down- and
    up-projections (q_layernorm / kv_layernorm on the latents when qk_layernorm).

    Checkpoint keys follow Megatron's Transformer Engine MLA layer, as the other specs' do: the
    latent norms fused into the up-projections (`linear_q_up_proj.layer_norm_weight`), a dense
    layer's pre-MLP norm into fc1; `input_layernorm` keeps its name (TE's MLA layer has it)."""
    norm = WrappedTorchNorm if qk_layernorm else IdentityOp
    keys = {
        "self_attention.q_layernorm.": "self_attention.linear_q_up_proj.layer_norm_",
        "self_attention.kv_layernorm.": "self_attention.linear_kv_up_proj.layer_norm_",
    }
    if num_experts is None:
        keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
    column = tensor_parallel.ColumnParallelLinear
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=MLASelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=MLASelfAttentionSubmodules(
                    linear_q_proj=column,
                    linear_q_down_proj=column,
                    linear_q_up_proj=column,
                    linear_kv_down_proj=column,
                    linear_kv_up_proj=column,
                    core_attention=core_attention,
                    linear_proj=tensor_parallel.RowParallelLinear,
                    q_layernorm=norm,
                    kv_layernorm=norm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=get_mlp_module_spec(num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=keys,
        ),
    )


def get_mlp_module_spec(
    use_te: bool = True,
    num_experts=None,
    moe_grouped_gemm: bool = False,
    fp8: str | None = None,
    use_te_op_fuser: bool = False,
    moe_use_legacy_grouped_gemm: bool = False,
) -> ModuleSpec:
    """Dense MLP spec with column/row-parallel fc1/fc2; with `num_experts`, the MoE spec.

    `use_te` and `use_te_op_fuser` pick the same modules here (no Transformer Engine): the
    numbers are those of Megatron's local MLP. Parameter order of megatron-core 0.19, which
    dropped 0.16's `moe_use_legacy_grouped_gemm` (here last, by keyword, only False).
    """

    _check(None)
    _refuse(fp8=(fp8, None), moe_use_legacy_grouped_gemm=(moe_use_legacy_grouped_gemm, False))
    if num_experts is not None:
        from gigatron.core.models.gpt.moe_module_specs import get_moe_module_spec

        return get_moe_module_spec(use_te, num_experts, moe_grouped_gemm)
    return ModuleSpec(
        module=MLP,
        submodules=MLPSubmodules(
            linear_fc1=tensor_parallel.ColumnParallelLinear,
            linear_fc2=tensor_parallel.RowParallelLinear,
        ),
    )


def get_gpt_layer_local_spec(
    num_experts: int | None = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    multi_latent_attention: bool = False,
    fp8: str | None = None,
    normalization: str | None = None,
    qk_l2_norm: bool = False,
    use_kitchen: bool = False,
    use_kitchen_attention: bool = False,
    kitchen_attention_backend: str = "sdpa",
    moe_use_legacy_grouped_gemm: bool = False,
) -> ModuleSpec:
    """Megatron's local GPT layer: DotProductAttention, plain norms (per config.normalization).

    Parameters in the API map's (0.20) order; `moe_use_legacy_grouped_gemm` (megatron-core 0.16,
    dropped later) comes last and, like the kitchen switches, is accepted only at its default.
    """
    _check(normalization)
    _refuse(
        use_kitchen_attention=(use_kitchen_attention, False),
        kitchen_attention_backend=(kitchen_attention_backend, "sdpa"),
        moe_use_legacy_grouped_gemm=(moe_use_legacy_grouped_gemm, False),
    )
    if qk_l2_norm or use_kitchen or fp8 is not None:
        raise ValueError("qk_l2_norm, use_kitchen and fp8 are not supported by gigatron's specs")
    return _layer_spec(
        DotProductAttention, qk_layernorm, num_experts, moe_grouped_gemm,
        multi_latent_attention=multi_latent_attention,
    )  # fmt: skip


def get_gpt_layer_fast_spec(
    num_experts: int | None = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    multi_latent_attention: bool = False,
    fp8: str | None = None,
    normalization: str | None = None,
    qk_l2_norm: bool = False,
    **unused,
) -> ModuleSpec:
    """Same layer as the local spec with SDPA core attention (flash/cuDNN/efficient on GPU)."""
    _check(normalization)
    if qk_l2_norm or fp8 is not None:
        raise ValueError("qk_l2_norm and fp8 are not supported by gigatron's specs")
    return _layer_spec(
        SDPADotProductAttention, qk_layernorm, num_experts, moe_grouped_gemm,
        multi_latent_attention=multi_latent_attention,
    )  # fmt: skip


def get_gpt_decoder_block_spec(
    config,
    use_transformer_engine: bool,
    normalization: str | None = None,
    qk_l2_norm: bool = False,
    vp_stage: int | None = None,
    pp_rank: int | None = None,
):
    """Per-layer specs of this pipeline stage: MoE layers where `config.moe_layer_freq` says.

    `use_transformer_engine=True` picks gigatron's fast spec (SDPA), the stand-in for Megatron's
    Transformer Engine spec.
    """
    from gigatron.core.transformer.transformer_layer import get_num_layers_to_build

    spec_fn = get_gpt_layer_fast_spec if use_transformer_engine else get_gpt_layer_local_spec
    kwargs = dict(
        qk_layernorm=config.qk_layernorm,
        multi_latent_attention=config.multi_latent_attention,
        normalization=normalization,
        qk_l2_norm=qk_l2_norm,
    )
    layer = spec_fn(**kwargs)
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    layer_specs = [layer] * num_layers
    if config.num_moe_experts is not None:
        from gigatron.core.transformer.moe.moe_utils import get_moe_layer_pattern
        from gigatron.core.transformer.transformer_layer import get_transformer_layer_offset

        moe_layer = spec_fn(
            num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm, **kwargs
        )
        pattern = get_moe_layer_pattern(config)
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
        layer_specs = [moe_layer if pattern[offset + i] else layer for i in range(num_layers)]
    return TransformerBlockSubmodules(layer_specs=layer_specs, layer_norm=WrappedTorchNorm)


def get_gpt_layer_with_transformer_engine_spec(
    num_experts: int | None = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    multi_latent_attention: bool = False,
    fp8: str | None = None,
    qk_l2_norm: bool = False,
    use_te_op_fuser: bool = False,
    use_kitchen: bool = False,
    use_te_activation_func: bool = False,
    use_kitchen_attention: bool = False,
    kitchen_attention_backend: str = "sdpa",
    mla_down_proj_fusion: bool = False,
    use_grouped_gemm_for_dense_mlp: bool = False,
    moe_use_legacy_grouped_gemm: bool = False,
) -> ModuleSpec:
    """Megatron scripts' TE spec, served by gigatron's fast spec (no Transformer Engine here).

    Parameters in the API map's (0.20) order, then megatron-core 0.16's
    `moe_use_legacy_grouped_gemm`. `use_te_op_fuser` / `use_te_activation_func` only choose TE
    kernels for the same math and are accepted; the kitchen, fused MLA down-projection and
    grouped-dense switches are accepted only at their defaults.

    Differences from Megatron's TE layer: the norms are separate modules, so the plain
    `state_dict()` names are `input_layernorm.*` / `pre_mlp_layernorm.*`; checkpoint keys
    (`sharded_state_dict`) are TE's `linear_qkv.layer_norm_*` / `linear_fc1.layer_norm_*`.
    """
    _refuse(
        use_kitchen=(use_kitchen, False),
        use_kitchen_attention=(use_kitchen_attention, False),
        kitchen_attention_backend=(kitchen_attention_backend, "sdpa"),
        mla_down_proj_fusion=(mla_down_proj_fusion, False),
        use_grouped_gemm_for_dense_mlp=(use_grouped_gemm_for_dense_mlp, False),
        moe_use_legacy_grouped_gemm=(moe_use_legacy_grouped_gemm, False),
    )
    return get_gpt_layer_fast_spec(
        num_experts=num_experts,
        moe_grouped_gemm=moe_grouped_gemm,
        qk_layernorm=qk_layernorm,
        multi_latent_attention=multi_latent_attention,
        fp8=fp8,
        qk_l2_norm=qk_l2_norm,
    )


def get_gpt_layer_local_submodules(*args, **kwargs) -> TransformerLayerSubmodules:
    """The submodules of `get_gpt_layer_local_spec(...)` (Megatron 0.20 builds the spec from
    them); same parameters, same refusals."""
    return get_gpt_layer_local_spec(*args, **kwargs).submodules


def get_gpt_layer_with_transformer_engine_submodules(*args, **kwargs) -> TransformerLayerSubmodules:
    """The submodules of `get_gpt_layer_with_transformer_engine_spec(...)`: without Transformer
    Engine, gigatron's fast-spec modules (SDPA core attention), as that spec documents."""
    return get_gpt_layer_with_transformer_engine_spec(*args, **kwargs).submodules


def get_gpt_mtp_block_spec(
    config,
    spec,
    use_transformer_engine: bool,
    vp_stage: int | None = None,
    pp_rank: int | None = None,
):
    """Multi-token-prediction block spec (MultiTokenPredictionBlockSubmodules) of this stage:
    mtp_num_layers MTP layers around the decoder's last layer spec (`spec`: a layer ModuleSpec
    or a TransformerBlockSubmodules) on the last pipeline stage; None elsewhere or without MTP.
    `use_transformer_engine` picks the same modules (there is no Transformer Engine here)."""
    return get_gpt_mtp_block_spec_for_backend(
        config=config, spec=spec, backend=None, vp_stage=vp_stage, pp_rank=pp_rank
    )


def get_gpt_mtp_block_spec_for_backend(
    config, spec, backend=None, vp_stage: int | None = None, pp_rank: int | None = None
):
    """`get_gpt_mtp_block_spec` with the norms / linear of `backend` (None: gigatron's)."""
    if get_mtp_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank) == 0:
        return None
    if isinstance(spec, TransformerBlockSubmodules):
        layer_spec = spec.layer_specs[-1]
    elif isinstance(spec, ModuleSpec) and spec.module is TransformerLayer:
        layer_spec = spec
    else:
        raise ValueError(
            "spec must be a TransformerLayer ModuleSpec or TransformerBlockSubmodules, got "
            f"{spec!r}"
        )
    mtp_layer = get_mtp_layer_spec_for_backend(layer_spec, backend=backend)
    count = 1 if config.mtp_use_repeated_layer else config.mtp_num_layers
    return MultiTokenPredictionBlockSubmodules(layer_specs=[mtp_layer] * count)
