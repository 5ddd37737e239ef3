"""GPTModel behaviour: Megatron's minimal model, output contracts, vocab padding, bad token ids,
pipeline-stage pieces, tied embeddings and checkpoint key names."""

import dataclasses

import pytest
import torch

from gigatron.core import parallel_state
from gigatron.core.models.common.vocab_utils import vocab_size_with_padding
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)


def _minimal(**kw):
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=12,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=100,
        max_sequence_length=64,
        **kw,
    )


def test_megatron_minimal_model_forward_backward():
    model = _minimal()
    ids = torch.randint(0, 100, (2, 8))
    pos = torch.arange(8)[None].expand(2, -1)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).triu(1)  # True = masked
    logits = model(ids, pos, mask)
    assert logits.shape == (2, 8, 100)
    loss = model(ids, pos, mask, labels=ids)
    assert loss.shape == (2, 8) and loss.dtype == torch.float32
    loss.mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), grads.keys()
    assert grads["decoder.layers.0.self_attention.linear_qkv.weight"].abs().sum() > 0


def test_loss_is_unreduced_per_token_cross_entropy():
    model = _minimal().eval()
    ids = torch.randint(0, 100, (2, 8))
    labels = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        logits = model(ids, None, None)
        loss = model(ids, None, None, labels=labels)
    ref = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 100), labels.reshape(-1), reduction="none"
    ).view(2, 8)
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-6)


def test_causal_none_mask_equals_explicit_causal_mask():
    model = _minimal().eval()
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).triu(1)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, None, None), model(ids, None, mask), rtol=0, atol=0)


def test_vocab_padding_and_divisibility_error():
    assert vocab_size_with_padding(50257, 128, 1) == 50304
    assert vocab_size_with_padding(50257, 128, 8) == 51200
    assert vocab_size_with_padding(100, 4, 2) == 104
    with pytest.raises(ValueError, match="orig_vocab_size"):
        vocab_size_with_padding(0)


def test_token_id_outside_vocab_names_the_id():
    model = _minimal()
    ids = torch.randint(0, 100, (2, 8))
    ids[1, 3] = 100
    with pytest.raises(ValueError, match=r"token id 100 at input_ids\[1, 3\]"):
        model(ids, None, None)
    ids[1, 3] = -7
    with pytest.raises(ValueError, match="token id -7"):
        model(ids, None, None)


def test_tied_embeddings_share_the_weight():
    model = _minimal(share_embeddings_and_output_weights=True).eval()
    assert model.output_layer.weight is None
    assert model.shared_embedding_or_output_weight() is model.embedding.word_embeddings.weight
    ids = torch.randint(0, 100, (1, 8))
    logits = model(ids, None, None)
    hidden = model.decoder(model.embedding(ids, None), None)  # [s, b, h]
    ref = (hidden @ model.embedding.word_embeddings.weight.t()).transpose(0, 1)
    torch.testing.assert_close(logits, ref)


def _stage(config, pp_rank, **kw):
    """Stage `pp_rank` of config's pipeline, built in this one process (Megatron's fake-init
    setters stand for the pipeline group)."""
    parallel_state.set_pipeline_model_parallel_world_size(config.pipeline_model_parallel_size)
    parallel_state.set_pipeline_model_parallel_rank(pp_rank)
    try:
        return GPTModel(config, get_gpt_layer_local_spec(), 100, 64, **kw).eval()
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_pipeline_model_parallel_world_size(None)


def test_pipeline_stage_pieces_compose_to_the_full_model():
    """Two stages of one layer each (global layer numbers 1 and 2) equal the 2-layer model."""
    full = _minimal().eval()
    config = dataclasses.replace(full.config, pipeline_model_parallel_size=2)
    first = _stage(config, 0, post_process=False)
    last = _stage(config, 1, pre_process=False)
    assert not hasattr(first, "output_layer") and not hasattr(last, "embedding")
    assert [layer.layer_number for layer in first.decoder.layers] == [1]
    assert [layer.layer_number for layer in last.decoder.layers] == [2]
    assert first.decoder.final_layernorm is None
    sd = full.state_dict()
    first.load_state_dict(
        {k: v for k, v in sd.items() if k.startswith(("embedding", "decoder.layers.0."))}
    )
    last.load_state_dict(
        {
            k.replace("decoder.layers.1.", "decoder.layers.0."): v
            for k, v in sd.items()
            if k.startswith(("output_layer", "decoder.final", "decoder.layers.1."))
        }
    )
    fc2 = last.sharded_state_dict()["decoder.layers.0.mlp.linear_fc2.weight"]  # local index
    assert (fc2.key, fc2.global_shape[0], fc2.global_offset[0]) == (
        "decoder.layers.mlp.linear_fc2.weight",
        2,
        1,  # stacked, at the global layer index
    )
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        hidden = first(ids, None, None)  # [s, b, h]
        assert hidden.shape == (8, 2, 12)
        last.set_input_tensor(hidden)
        torch.testing.assert_close(last(None, None, None), full(ids, None, None))


def test_sharded_state_dict_is_megatrons_contract():
    """Keyed by the module's own state-dict keys; values ShardedTensor / factory / object whose
    `.key` is the checkpoint key: layers stacked on a prepended axis, norms under TE's names."""
    from gigatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    from gigatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    model = _minimal()
    sd = model.sharded_state_dict()
    own = set(model.state_dict()) - {"output_layer._extra_state"}  # Megatron's GPT drops it
    assert set(sd) == own
    assert all(
        isinstance(v, (ShardedTensor, ShardedTensorFactory, ShardedObject)) for v in sd.values()
    )
    norm = sd["decoder.layers.1.input_layernorm.weight"]
    assert norm.key == "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
    assert (norm.global_shape, norm.global_offset, norm.prepend_axis_num) == ((2, 12), (1, 0), 1)
    assert sd["decoder.layers.0.pre_mlp_layernorm.bias"].key == (
        "decoder.layers.mlp.linear_fc1.layer_norm_bias"
    )
    proj = sd["decoder.layers.0.self_attention.linear_proj.weight"]
    assert (proj.key, proj.replica_id) == (
        "decoder.layers.self_attention.linear_proj.weight",
        (0, 0, 0),
    )
    extra = sd["decoder.layers.1.mlp.linear_fc2._extra_state"]
    assert (extra.key, extra.global_shape, extra.global_offset) == (
        "decoder.layers.mlp.linear_fc2._extra_state",
        (2,),
        (1,),
    )
    assert sd["decoder.final_layernorm.weight"].prepend_axis_num == 0
    assert sd["embedding.word_embeddings.weight"].allow_shape_mismatch
    assert sd["output_layer.weight"].allow_shape_mismatch
    per_layer = model.sharded_state_dict(metadata={"non_homogeneous_layers": True})
    assert set(per_layer) == own
    norm = per_layer["decoder.layers.1.input_layernorm.weight"]
    assert norm.key == "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"
    assert norm.prepend_axis_num == 0 and norm.global_shape == (12,)
    with pytest.raises(ValueError, match="singleton_local_shards"):  # not silently ignored
        model.sharded_state_dict(metadata={"singleton_local_shards": True})


def test_decoder_block_spec_builds_the_same_model():
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention

    base = _minimal().eval()
    block_spec = get_gpt_decoder_block_spec(base.config, use_transformer_engine=True)
    assert len(block_spec.layer_specs) == 2
    model = GPTModel(base.config, block_spec, 100, 64).eval()
    assert isinstance(
        model.decoder.layers[0].self_attention.core_attention, SDPADotProductAttention
    )
    model.load_state_dict(base.state_dict())
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, None, None), base(ids, None, None), atol=1e-5, rtol=0)
