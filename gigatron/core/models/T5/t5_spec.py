"""Layer and block specs for T5Model (mirrors `megatron.core.models.T5.t5_spec`).

Encoder layer: norm, SelfAttention (arbitrary mask: the dataset's [b, 1, s, s] padding mask),
norm, MLP. Decoder layer: norm, SelfAttention (causal), norm, CrossAttention over the encoder
output (arbitrary mask), norm, MLP. All local (column/row-parallel linears, DotProductAttention);
the `*_transformer_engine_*` names return the same layers (no Transformer Engine in gigatron).
"""

from __future__ import annotations

from gigatron.core import tensor_parallel
from gigatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from gigatron.core.models.gpt.gpt_layer_specs import LOCAL_SHARDED_KEYS_MAP
from gigatron.core.transformer.attention import (
    CrossAttention,
    CrossAttentionSubmodules,
    SelfAttention,
    SelfAttentionSubmodules,
)
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.identity_op import IdentityOp
from gigatron.core.transformer.mlp import MLP, MLPSubmodules
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_block import TransformerBlockSubmodules
from gigatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)


def _self_attention(mask_type) -> ModuleSpec:
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": mask_type},
        submodules=SelfAttentionSubmodules(
            linear_qkv=tensor_parallel.ColumnParallelLinear,
            core_attention=DotProductAttention,
            linear_proj=tensor_parallel.RowParallelLinear,
            q_layernorm=IdentityOp,
            k_layernorm=IdentityOp,
        ),
    )


def _mlp() -> ModuleSpec:
    return ModuleSpec(
        module=MLP,
        submodules=MLPSubmodules(
            linear_fc1=tensor_parallel.ColumnParallelLinear,
            linear_fc2=tensor_parallel.RowParallelLinear,
        ),
    )


def encoder_model_with_local_spec() -> ModuleSpec:
    """T5 encoder layer: bidirectional self-attention under the given (padding) mask."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=_self_attention(AttnMaskType.arbitrary),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=_mlp(),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=dict(LOCAL_SHARDED_KEYS_MAP),
        ),
    )


def decoder_model_with_local_spec() -> ModuleSpec:
    """T5 decoder layer: causal self-attention, cross-attention to the encoder, MLP."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=_self_attention(AttnMaskType.causal),
            self_attn_bda=get_bias_dropout_add,
            pre_cross_attn_layernorm=WrappedTorchNorm,
            cross_attention=ModuleSpec(
                module=CrossAttention,
                params={"attn_mask_type": AttnMaskType.arbitrary},
                submodules=CrossAttentionSubmodules(
                    linear_q=tensor_parallel.ColumnParallelLinear,
                    linear_kv=tensor_parallel.ColumnParallelLinear,
                    core_attention=DotProductAttention,
                    linear_proj=tensor_parallel.RowParallelLinear,
                ),
            ),
            cross_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=_mlp(),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=dict(LOCAL_SHARDED_KEYS_MAP),
        ),
    )


def get_t5_encoder_with_local_block_spec(num_layers: int) -> TransformerBlockSubmodules:
    """`num_layers` encoder layers and a final norm."""
    return TransformerBlockSubmodules(
        [encoder_model_with_local_spec()] * num_layers, WrappedTorchNorm
    )


def get_t5_decoder_with_local_block_spec(num_layers: int) -> TransformerBlockSubmodules:
    """`num_layers` decoder layers and a final norm."""
    return TransformerBlockSubmodules(
        [decoder_model_with_local_spec()] * num_layers, WrappedTorchNorm
    )


# Megatron's Transformer Engine names, served by the local layers.
encoder_model_with_transformer_engine_default_spec = encoder_model_with_local_spec
decoder_model_with_transformer_engine_default_spec = decoder_model_with_local_spec
get_t5_encoder_with_transformer_engine_block_spec = get_t5_encoder_with_local_block_spec
get_t5_decoder_with_transformer_engine_block_spec = get_t5_decoder_with_local_block_spec
