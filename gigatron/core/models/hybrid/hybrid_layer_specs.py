"""Layer specs of hybrid models: `hybrid_stack_spec` (Megatron's name, and the spec its
examples/mamba/train.sh passes with `--spec megatron.core.models.hybrid.hybrid_layer_specs
hybrid_stack_spec`).

Mirrors `megatron.core.models.hybrid.hybrid_layer_specs`. Megatron's spec is built from
Transformer Engine modules with the norms fused into the first linear of each layer; gigatron's
uses its own TP linears with separate norms and writes TE's checkpoint keys
(`mixer.in_proj.layer_norm_weight`, `self_attention.linear_qkv.layer_norm_weight`,
`mlp.linear_fc1.layer_norm_weight`) through each layer's `sharded_state_dict_keys_map`.
"""

from __future__ import annotations

from gigatron.core import tensor_parallel
from gigatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from gigatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from gigatron.core.ssm.mamba_block import HybridStack, HybridStackSubmodules
from gigatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from gigatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from gigatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.mlp import MLP, MLPSubmodules
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
)

_DENSE_MLP = ModuleSpec(
    module=MLP,
    submodules=MLPSubmodules(
        linear_fc1=tensor_parallel.ColumnParallelLinear,
        linear_fc2=tensor_parallel.RowParallelLinear,
    ),
)

hybrid_stack_spec = ModuleSpec(
    module=HybridStack,
    submodules=HybridStackSubmodules(
        mamba_layer=ModuleSpec(
            module=MambaLayer,
            submodules=MambaLayerSubmodules(
                norm=WrappedTorchNorm,
                mixer=ModuleSpec(
                    module=MambaMixer,
                    submodules=MambaMixerSubmodules(
                        in_proj=tensor_parallel.ColumnParallelLinear,
                        out_proj=tensor_parallel.RowParallelLinear,
                    ),
                ),
                mamba_bda=get_bias_dropout_add,
                sharded_state_dict_keys_map={"norm.": "mixer.in_proj.layer_norm_"},
            ),
        ),
        attention_layer=ModuleSpec(
            module=TransformerLayer,
            submodules=TransformerLayerSubmodules(
                input_layernorm=WrappedTorchNorm,
                self_attention=ModuleSpec(
                    module=SelfAttention,
                    params={"attn_mask_type": AttnMaskType.causal},
                    submodules=SelfAttentionSubmodules(
                        linear_qkv=tensor_parallel.ColumnParallelLinear,
                        core_attention=DotProductAttention,
                        linear_proj=tensor_parallel.RowParallelLinear,
                    ),
                ),
                self_attn_bda=get_bias_dropout_add,
                sharded_state_dict_keys_map={
                    "input_layernorm.": "self_attention.linear_qkv.layer_norm_"
                },
            ),
        ),
        mlp_layer=ModuleSpec(
            module=TransformerLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=WrappedTorchNorm,
                mlp=_DENSE_MLP,
                mlp_bda=get_bias_dropout_add,
                sharded_state_dict_keys_map={"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"},
            ),
        ),
        moe_layer=ModuleSpec(
            module=TransformerLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=WrappedTorchNorm,
                mlp=get_moe_module_spec(True, 8, False),  # any expert count: the config's rules
                mlp_bda=get_bias_dropout_add,
            ),
        ),
    ),
)
