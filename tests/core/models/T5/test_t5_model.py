"""T5Model on one rank: causal decoder (a later decoder token cannot change earlier logits),
padded encoder tokens are invisible under the local-spec masks, Megatron's key names, and the
'relative' positions (bias on every self-attention) change the output and get grads."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.models.T5 import T5Model
from gigatron.core.models.T5.t5_spec import (
    get_t5_decoder_with_local_block_spec,
    get_t5_encoder_with_local_block_spec,
)
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=1234)


def _model(**kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        activation_func=F.gelu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return T5Model(
        cfg,
        dataclasses.replace(cfg),
        get_t5_encoder_with_local_block_spec(1),
        get_t5_decoder_with_local_block_spec(1),
        vocab_size=32,
        max_sequence_length=16,
        **kw,
    ).eval()


def _masks(enc, dec):
    def keep(q, k):
        return ~((q[:, :, None] >= 1) & (k[:, None, :] >= 1))[:, None]

    causal = torch.ones(dec.shape[1], dec.shape[1], dtype=torch.bool).triu(1)
    return keep(enc, enc), keep(dec, dec) | causal, keep(dec, enc)


def test_decoder_is_causal_and_encoder_padding_is_invisible():
    model = _model(share_embeddings_and_output_weights=True)
    g = torch.Generator().manual_seed(0)
    enc = torch.randint(1, 32, (2, 10), generator=g)
    enc[:, 7:] = 0
    dec = torch.randint(1, 32, (2, 6), generator=g)
    with torch.no_grad():
        base = model(enc, dec, *_masks(enc, dec))
        dec2 = dec.clone()
        dec2[:, 4] = (dec2[:, 4] % 31) + 1  # change one later decoder token
        changed = model(enc, dec2, *_masks(enc, dec2))
        enc2 = enc.clone()
        enc2[:, 8] = 5  # a padded encoder position gets a token, still masked as padding
        masks = _masks(enc, dec)
        padded = model(enc2, dec, *masks)
    assert base.shape == (2, 6, 32)
    torch.testing.assert_close(changed[:, :4], base[:, :4], rtol=0, atol=0)
    assert (changed[:, 4:] - base[:, 4:]).abs().max() > 1e-4
    torch.testing.assert_close(padded, base, rtol=0, atol=1e-6)


def test_megatron_key_names():
    keys = set(_model(share_embeddings_and_output_weights=True).state_dict())
    for key in (
        "embedding.word_embeddings.weight",
        "encoder.layers.0.self_attention.linear_qkv.weight",
        "encoder.final_layernorm.weight",
        "decoder.layers.0.cross_attention.linear_q.weight",
        "decoder.layers.0.cross_attention.linear_kv.weight",
        "decoder.layers.0.pre_cross_attn_layernorm.weight",
        "decoder.final_layernorm.weight",
        "lm_head.output_layer.bias",
    ):
        assert key in keys, key
    untied = set(_model().state_dict())
    assert "lm_head.output_layer.weight" in untied and "lm_head.output_layer.bias" not in untied


def test_unknown_position_type_refused():
    with pytest.raises(ValueError, match="position_embedding_type"):
        _model(position_embedding_type="alibi")


def test_relative_positions_shape_attention():
    """With 'relative' (no learned positions) the bias is the only position signal: the
    encoder output depends on it, and its grads reach both tables."""
    model = _model(position_embedding_type="relative")
    assert not hasattr(model.embedding, "position_embeddings")
    g = torch.Generator().manual_seed(0)
    enc, dec = torch.randint(1, 32, (2, 10), generator=g), torch.randint(1, 32, (2, 6), generator=g)
    masks = _masks(enc, dec)
    loss = model(enc, dec, *masks, lm_labels=torch.randint(0, 32, (2, 6), generator=g))
    loss.sum().backward()
    for stack in ("encoder", "decoder"):
        grad = getattr(model, f"{stack}_relative_pos_emb").relative_attention_bias.weight.grad
        assert grad is not None and grad.abs().sum() > 0, stack
    with torch.no_grad():
        base = model(enc, dec, *masks)
        table = model.encoder_relative_pos_emb.relative_attention_bias.weight
        table.copy_(torch.randn(table.shape, generator=g) * 3)
        assert (model(enc, dec, *masks) - base).abs().max() > 5e-4  # logits are ~0.1 here


def test_neither_stack_holds_embeddings_and_head_only_and_refuses_forward():
    """Megatron builds a T5Model with add_encoder and add_decoder None (its checkpoint tests do):
    the embeddings and LM head only. Running it is refused with a message saying why."""
    model = _model(add_encoder=None, add_decoder=None)
    assert model.encoder is None and model.decoder is None
    assert {k.split(".")[0] for k in model.state_dict()} <= {
        "embedding",
        "position_embeddings",
        "lm_head",
        "output_layer",
    }
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="add_encoder and add_decoder False"):
        model(ids, ids, None, None, None)
