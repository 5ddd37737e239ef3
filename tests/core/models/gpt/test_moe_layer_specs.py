"""MoE through the GPT specs: get_gpt_layer_local_spec / fast spec build MoELayers, the decoder
block spec follows moe_layer_freq, and a GPTModel logs its aux losses per (global) layer."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.mlp import MLP
from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe.experts import GroupedMLP, SequentialMLP
from gigatron.core.transformer.moe.moe_layer import MoELayer
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


@pytest.fixture(autouse=True)
def moe_logging():
    moe_utils.get_moe_layer_wise_logging_tracker().clear()
    yield
    moe_utils.get_moe_layer_wise_logging_tracker().clear()


def _config(**kw):
    base = dict(
        num_layers=4,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=48,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_aux_loss_coeff=0.01,
        moe_z_loss_coeff=1e-3,
        moe_layer_freq=2,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        normalization="RMSNorm",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    base.update(kw)
    return TransformerConfig(**base)


@pytest.mark.parametrize("spec_fn", [get_gpt_layer_local_spec, get_gpt_layer_fast_spec])
@pytest.mark.parametrize("grouped", [False, True])
def test_layer_specs_build_moe_layers(spec_fn, grouped):
    cfg = _config(moe_grouped_gemm=grouped)
    spec = spec_fn(num_experts=4, moe_grouped_gemm=grouped)
    assert spec.submodules.mlp.module is MoELayer
    model = GPTModel(
        cfg, spec, vocab_size=64, max_sequence_length=16, position_embedding_type="rope"
    )
    experts = model.decoder.layers[0].mlp.experts
    assert isinstance(experts, GroupedMLP if grouped else SequentialMLP)


def test_decoder_block_spec_follows_moe_layer_freq_and_logs_per_layer():
    cfg = _config()
    block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
    model = GPTModel(
        cfg, block, vocab_size=64, max_sequence_length=16, position_embedding_type="rope"
    ).train()
    kinds = [type(layer.mlp) for layer in model.decoder.layers]
    assert kinds == [MoELayer, MLP, MoELayer, MLP]
    assert [layer.mlp.router.layer_number for layer in model.decoder.layers[::2]] == [1, 3]
    ids = torch.randint(0, 64, (2, 16))
    model(ids, None, attention_mask=None, labels=ids).mean().backward()
    assert model.decoder.layers[0].mlp.router.weight.grad.abs().sum() > 0
    totals = {}
    per_layer = moe_utils.track_moe_metrics(
        loss_scale=1.0, iteration=1, total_loss_dict=totals, num_layers=4, moe_layer_freq=2
    )
    lb = per_layer["load_balancing_loss"]
    assert lb[0] > 0 and lb[2] > 0 and lb[1] == 0 and lb[3] == 0
    # balanced routing gives 1, the worst case E / k = 2 (k = 2 of 4 experts)
    assert all(0.9 < v < 2.0 for v in lb[[0, 2]].tolist())
    assert totals["load_balancing_loss"] == pytest.approx(lb.sum().item() / 2)
    assert per_layer["z_loss"][0] > 0
    assert moe_utils.get_moe_layer_wise_logging_tracker()["z_loss"]["values"].sum() == 0
