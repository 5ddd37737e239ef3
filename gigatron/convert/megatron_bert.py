"""transformers' MegatronBertForPreTraining state dict -> BertModel (Megatron key names).

A state-dict mapping (not a `gigatron convert` family: the converter builds GPT models).
The Hugging Face port keeps Megatron's pre-norm layout; only names differ and Q, K, V are
separate (fused here into Megatron's per-group QKV rows). The LM decoder weight is tied to the
word embeddings there, so BertModel is built with share_embeddings_and_output_weights=True.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from gigatron.convert._recipe_ops import qkv_to_megatron
from gigatron.core.transformer.transformer_config import TransformerConfig

_LAYER = {
    "attention.ln.": "input_layernorm.",
    "attention.output.dense.": "self_attention.linear_proj.",
    "ln.": "pre_mlp_layernorm.",
    "intermediate.dense.": "mlp.linear_fc1.",
    "output.dense.": "mlp.linear_fc2.",
}
_TOP = {
    "bert.embeddings.word_embeddings.weight": "embedding.word_embeddings.weight",
    "bert.embeddings.position_embeddings.weight": "embedding.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight": "embedding.tokentype_embeddings.weight",
    "bert.encoder.ln.weight": "encoder.final_layernorm.weight",
    "bert.encoder.ln.bias": "encoder.final_layernorm.bias",
    "bert.pooler.dense.weight": "pooler.dense.weight",
    "bert.pooler.dense.bias": "pooler.dense.bias",
    "cls.predictions.transform.dense.weight": "lm_head.dense.weight",
    "cls.predictions.transform.dense.bias": "lm_head.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "lm_head.layer_norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "lm_head.layer_norm.bias",
    "cls.predictions.bias": "output_layer.bias",
    "cls.seq_relationship.weight": "binary_head.weight",
    "cls.seq_relationship.bias": "binary_head.bias",
}


def megatron_bert_config_to_transformer_config(hf_config, **overrides):
    """HF MegatronBertConfig -> (TransformerConfig, BertModel keyword arguments)."""
    if hf_config.hidden_act != "gelu":
        raise ValueError(f"hidden_act ({hf_config.hidden_act!r}) must be 'gelu' (erf)")
    kwargs = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        ffn_hidden_size=hf_config.intermediate_size,
        layernorm_epsilon=hf_config.layer_norm_eps,
        activation_func=F.gelu,
        hidden_dropout=hf_config.hidden_dropout_prob,
        attention_dropout=hf_config.attention_probs_dropout_prob,
        init_method_std=hf_config.initializer_range,
        add_bias_linear=True,
    )
    kwargs.update(overrides)
    model_kwargs = dict(
        num_tokentypes=hf_config.type_vocab_size,
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        share_embeddings_and_output_weights=True,
        add_binary_head=True,
    )
    return TransformerConfig(**kwargs), model_kwargs


def megatron_bert_to_megatron(hf_sd: dict[str, Tensor], num_heads: int) -> dict[str, Tensor]:
    """MegatronBertForPreTraining state dict -> full (unsharded) BertModel state dict."""
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, Tensor]] = {}
    for name, tensor in hf_sd.items():
        if name in _TOP:
            out[_TOP[name]] = tensor
            continue
        if not name.startswith("bert.encoder.layer."):
            continue  # cls.predictions.decoder.* are the tied embedding and bias
        index, rest = name[len("bert.encoder.layer.") :].split(".", 1)
        if rest.startswith("attention.self."):
            proj, kind = rest[len("attention.self.") :].split(".")
            qkv.setdefault((int(index), kind), {})[proj] = tensor
            continue
        for old, new in _LAYER.items():
            if rest.startswith(old):
                out[f"encoder.layers.{index}.{new}{rest[len(old) :]}"] = tensor
                break
        else:
            raise ValueError(f"unmapped MegatronBert key {name!r}")
    for (index, kind), parts in qkv.items():
        fused = qkv_to_megatron(parts["query"], parts["key"], parts["value"], num_heads, num_heads)
        out[f"encoder.layers.{index}.self_attention.linear_qkv.{kind}"] = fused
    return {k: v.contiguous() for k, v in out.items()}
