"""Layer spec for BertModel (mirrors `megatron.core.models.bert.bert_layer_specs`).

`bert_layer_local_spec`: the GPT local layer with a *padding* (bidirectional) self-attention
mask: norms, SelfAttention with column/row-parallel projections and DotProductAttention, MLP,
bias-dropout-add. `get_bert_layer_with_transformer_engine_spec` (no Transformer Engine here)
returns the same layer with gigatron's SDPA core attention.
"""

from __future__ import annotations

from gigatron.core.models.gpt.gpt_layer_specs import _layer_spec
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
from gigatron.core.transformer.spec_utils import ModuleSpec


def _bert_layer_spec(core_attention) -> ModuleSpec:
    """GPT's local layer (no qk norms, dense MLP) with a padding self-attention mask."""
    return _layer_spec(core_attention, qk_layernorm=False, attn_mask_type=AttnMaskType.padding)


bert_layer_local_spec = _bert_layer_spec(DotProductAttention)


def get_bert_layer_with_transformer_engine_spec() -> ModuleSpec:
    """Megatron's TE BERT spec, served by the local layer with SDPA core attention."""

    return _bert_layer_spec(SDPADotProductAttention)
