"""BertModel and T5Model save and load with Megatron's snippet (`save(model.sharded_state_dict(),
d)`, `model.load_state_dict(load(model.sharded_state_dict(), d))`): a fresh model loads the saved
weights exactly; checkpoint keys are Megatron's (TE norm names, stacked layers)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import dist_checkpointing
from gigatron.core.models.bert import BertModel
from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from gigatron.core.models.T5 import T5Model
from gigatron.core.models.T5.t5_spec import (
    get_t5_decoder_with_local_block_spec,
    get_t5_encoder_with_local_block_spec,
)
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _config():
    return TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=2, activation_func=F.gelu
    )


def _bert():
    return BertModel(_config(), 2, bert_layer_local_spec, 32, 16)


def _t5():
    cfg = _config()
    return T5Model(
        cfg,
        dataclasses.replace(cfg),
        get_t5_encoder_with_local_block_spec(2),
        get_t5_decoder_with_local_block_spec(2),
        vocab_size=32,
        max_sequence_length=16,
        share_embeddings_and_output_weights=True,
        position_embedding_type="relative",
    )


@pytest.mark.parametrize(
    "build, keys",
    [
        (_bert, ["encoder.layers.self_attention.linear_qkv.layer_norm_weight",
                 "embedding.tokentype_embeddings.weight", "output_layer.bias"]),
        (_t5, ["decoder.layers.self_attention.linear_qkv.weight",
               "encoder.layers.mlp.linear_fc1.layer_norm_weight",
               "decoder_relative_pos_emb.relative_attention_bias.weight"]),
    ],
)  # fmt: skip
def test_save_load_roundtrip(tmp_path, build, keys):
    torch.manual_seed(0)
    saved = build()
    sd = saved.sharded_state_dict()
    assert set(sd) == set(saved.state_dict())
    ckpt_keys = {sh.key for sh in sd.values()}
    for key in keys:
        assert key in ckpt_keys, (key, sorted(ckpt_keys))
    dist_checkpointing.save(sd, str(tmp_path))
    torch.manual_seed(1)
    fresh = build()
    before = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    fresh.load_state_dict(dist_checkpointing.load(fresh.sharded_state_dict(), str(tmp_path)))
    for name, p in fresh.named_parameters():
        ref = dict(saved.named_parameters())[name]
        torch.testing.assert_close(p, ref, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(before[n], p) for n, p in fresh.named_parameters())
