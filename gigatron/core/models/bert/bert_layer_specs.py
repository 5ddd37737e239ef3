"""Layer spec for BertModel (mirrors `megatron.core.models.bert.bert_layer_specs`).

`bert_layer_local_spec`: the GPT local layer with a *padding* (bidirectional) self-attention
mask: norms, SelfAttention with column/row-parallel projections and DotProductAttention, MLP,
bias-dropout-add. `get_bert_layer_with_transformer_engine_spec` (no Transformer Engine here)
returns the same layer with gigatron's SDPA core attention.
"""

from __future__ import annotations

import dataclasses
import warnings

from gigatron.core.models.gpt.gpt_layer_specs import _layer_spec
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
from gigatron.core.transformer.spec_utils import ModuleSpec


def _bert_layer_spec(core_attention, qk_norm_unset: bool = False) -> ModuleSpec:
    """GPT's local layer (no qk norms, dense MLP) with a padding self-attention mask;
    `qk_norm_unset`: q/k_layernorm None (Megatron's TE spec) so that config.qk_layernorm picks
    the default norm, instead of IdentityOp."""
    spec = _layer_spec(core_attention, qk_layernorm=False, attn_mask_type=AttnMaskType.padding)
    if qk_norm_unset:
        attention = spec.submodules.self_attention
        attention.submodules = dataclasses.replace(
            attention.submodules, q_layernorm=None, k_layernorm=None
        )
    return spec


bert_layer_local_spec = _bert_layer_spec(DotProductAttention)


def get_bert_layer_with_transformer_engine_spec() -> ModuleSpec:
    """Megatron's TE BERT spec, served by the local layer with SDPA core attention."""

    return _bert_layer_spec(SDPADotProductAttention, qk_norm_unset=True)


def get_bert_layer_with_transformer_engine_submodules():
    """The `TransformerLayerSubmodules` of `get_bert_layer_with_transformer_engine_spec()`."""
    return get_bert_layer_with_transformer_engine_spec().submodules


def __getattr__(name: str):
    # Megatron's deprecated module attribute, built on access.
    if name == "bert_layer_with_transformer_engine_spec":
        warnings.warn(
            "bert_layer_specs.bert_layer_with_transformer_engine_spec is deprecated: call "
            "get_bert_layer_with_transformer_engine_spec()",
            DeprecationWarning,
            stacklevel=2,
        )
        return get_bert_layer_with_transformer_engine_spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
