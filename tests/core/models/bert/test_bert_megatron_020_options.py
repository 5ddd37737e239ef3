"""BertModel's Megatron 0.20 options: apply_lm_head, output_layer_bias, the attention-mask
layout check, and the TE spec's unset Q/K norms (filled from config.qk_layernorm)."""

import pytest
import torch

from gigatron.core.models.bert import BertModel
from gigatron.core.models.bert import bert_layer_specs as specs
from gigatron.core.transformer.enums import AttnBackend
from gigatron.core.transformer.torch_norm import LayerNorm
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _bert(spec=None, **kw):
    config_kw = {k: kw.pop(k) for k in ("qk_layernorm", "attention_backend") if k in kw}
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, **config_kw)
    spec = spec or specs.bert_layer_local_spec
    return BertModel(
        config, num_tokentypes=0, transformer_layer_spec=spec, vocab_size=64,
        max_sequence_length=8, add_binary_head=False, **kw,
    )  # fmt: skip


def test_apply_lm_head_false_projects_the_encoder_output(single_rank):
    model = _bert(apply_lm_head=False, output_layer_bias=False).eval()
    assert model.lm_head is None and model.output_layer.bias is None
    seen = {}
    model.encoder.register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    ids = torch.arange(8).repeat(2, 1)
    logits, _ = model(ids, attention_mask=torch.ones(2, 8, dtype=torch.bool))
    weight = model.output_layer.weight
    torch.testing.assert_close(logits, (seen["h"] @ weight.t()).transpose(0, 1))


def test_default_keeps_lm_head_and_bias(single_rank):
    model = _bert()
    assert model.lm_head is not None and model.output_layer.bias is not None
    assert model.attn_mask_dimensions == "b1ss"


def test_local_core_attention_needs_local_or_auto_backend(single_rank):
    with pytest.raises(ValueError, match="Expected AttnBackend to be local or auto"):
        _bert(attention_backend=AttnBackend.flash)


def test_te_spec_leaves_qk_norms_unset_and_config_fills_them(single_rank):
    spec = specs.get_bert_layer_with_transformer_engine_spec()
    assert spec.submodules.self_attention.submodules.q_layernorm is None
    assert specs.get_bert_layer_with_transformer_engine_submodules().self_attention is not None
    plain = _bert(spec)
    assert plain.encoder.layers[0].self_attention.q_layernorm is None
    normed = _bert(specs.get_bert_layer_with_transformer_engine_spec(), qk_layernorm=True)
    assert isinstance(normed.encoder.layers[0].self_attention.k_layernorm, LayerNorm)


def test_deprecated_module_attribute_warns_and_builds():
    with pytest.warns(DeprecationWarning, match="get_bert_layer_with_transformer_engine_spec"):
        spec = specs.bert_layer_with_transformer_engine_spec
    assert spec.submodules.self_attention.submodules.k_layernorm is None
