"""BertModel reproduces transformers' MegatronBertForPreTraining (the Hugging Face port of
Megatron's BERT): masked-LM logits, next-sentence logits and both losses, from the same random
weights mapped through gigatron.convert.megatron_bert (fp32)."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.convert import megatron_bert as hf_mapping
from gigatron.core.models.bert import BertModel
from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from gigatron.core.models.common.tp_state_dict import load_full_state_dict
from tests._one_rank import one_rank_fixtures

transformers = pytest.importorskip("transformers")


gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _pair():
    torch.manual_seed(0)
    hf_cfg = transformers.MegatronBertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    hf = transformers.MegatronBertForPreTraining(hf_cfg).eval()
    with torch.no_grad():  # random norms and biases make their mapping observable
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "ln" in name.lower() else 0.0))
    config, kwargs = hf_mapping.megatron_bert_config_to_transformer_config(hf_cfg)
    model = BertModel(config, transformer_layer_spec=bert_layer_local_spec, **kwargs).eval()
    sd = hf_mapping.megatron_bert_to_megatron(hf.state_dict(), config.num_attention_heads)
    load_full_state_dict(model, sd)
    return hf, model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (3, 16), generator=g)
    types = (torch.arange(16) >= 7).long()[None].expand(3, -1).contiguous()
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 12:] = 0  # padded tails: Megatron masks pad queries too, so compare real tokens
    mask[2, 9:] = 0
    labels = torch.full((3, 16), -100)
    labels[:, [2, 5, 8]] = torch.randint(0, 64, (3, 3), generator=g)
    nsp = torch.tensor([0, 1, 1])
    return ids, types, mask, labels, nsp


def test_logits_and_losses_match_megatron_bert_for_pretraining():
    hf, model = _pair()
    ids, types, mask, labels, nsp = _batch()
    with torch.no_grad():
        ref = hf(
            input_ids=ids,
            token_type_ids=types,
            attention_mask=mask,
            labels=labels,
            next_sentence_label=nsp,
        )
        logits, binary = model(ids, mask, tokentype_ids=types)
        loss, binary2 = model(ids, mask, tokentype_ids=types, lm_labels=labels.clamp(min=0))
    real = mask.bool()
    torch.testing.assert_close(logits[real], ref.prediction_logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(binary, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(binary2, binary)
    # Megatron's BERT loss: masked-LM mean over the masked positions + next-sentence CE.
    loss_mask = (labels >= 0).float()
    lm_loss = (loss * loss_mask).sum() / loss_mask.sum()
    total = lm_loss + F.cross_entropy(binary.float(), nsp)
    torch.testing.assert_close(total, ref.loss, rtol=1e-5, atol=1e-5)
    assert logits.shape == (3, 16, 64) and binary.shape == (3, 2)


def test_state_dict_keys_are_megatrons():
    _, model = _pair()
    keys = set(model.state_dict())
    for key in (
        "embedding.word_embeddings.weight",
        "embedding.tokentype_embeddings.weight",
        "encoder.layers.0.self_attention.linear_qkv.weight",
        "encoder.final_layernorm.weight",
        "lm_head.dense.weight",
        "lm_head.layer_norm.weight",
        "output_layer.bias",
        "pooler.dense.weight",
        "binary_head.weight",
    ):
        assert key in keys, key
    assert "output_layer.weight" not in keys  # tied to the word embeddings


def test_tokentype_ids_required_with_tokentypes():
    _, model = _pair()
    ids, _, mask, _, _ = _batch()
    with pytest.raises(ValueError, match="tokentype_ids"):
        model(ids, mask)
