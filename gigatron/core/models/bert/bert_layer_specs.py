"""Layer spec for BertModel (mirrors `megatron.core.models.bert.bert_layer_specs`).

`bert_layer_local_spec`: the GPT local layer with a *padding* (bidirectional) self-attention
mask: norms, SelfAttention with column/row-parallel projections and DotProductAttention, MLP,
bias-dropout-add. `get_bert_layer_with_transformer_engine_spec` (no Transformer Engine here)
returns the same layer with gigatron's SDPA core attention.
"""

from __future__ import annotations

from gigatron.core import tensor_parallel
from gigatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from gigatron.core.models.gpt.gpt_layer_specs import LOCAL_SHARDED_KEYS_MAP
from gigatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.identity_op import IdentityOp
from gigatron.core.transformer.mlp import MLP, MLPSubmodules
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)


def _bert_layer_spec(core_attention) -> ModuleSpec:
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=tensor_parallel.ColumnParallelLinear,
                    core_attention=core_attention,
                    linear_proj=tensor_parallel.RowParallelLinear,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(
                    linear_fc1=tensor_parallel.ColumnParallelLinear,
                    linear_fc2=tensor_parallel.RowParallelLinear,
                ),
            ),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=dict(LOCAL_SHARDED_KEYS_MAP),
        ),
    )


bert_layer_local_spec = _bert_layer_spec(DotProductAttention)


def get_bert_layer_with_transformer_engine_spec() -> ModuleSpec:
    """Megatron's TE BERT spec, served by the local layer with SDPA core attention."""
    from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention

    return _bert_layer_spec(SDPADotProductAttention)
