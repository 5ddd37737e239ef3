"""Selective (core_attn, mlp) and full (uniform, block) activation recompute give the same
gradients as no recompute, with hidden and attention dropout on."""

import dataclasses

import pytest
import torch

from gigatron.core import tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


BASE = TransformerConfig(
    num_layers=3,
    hidden_size=16,
    num_attention_heads=4,
    num_query_groups=2,
    hidden_dropout=0.2,
    attention_dropout=0.2,
    use_cpu_initialization=True,
    gated_linear_unit=True,
    activation_func=torch.nn.functional.silu,
)


def _grads(config, state):
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = GPTModel(config, get_gpt_layer_local_spec(), 64, 16, position_embedding_type="rope")
    if state is not None:
        model.load_state_dict(state)
    ids = torch.arange(32).view(2, 16) % 64
    torch.manual_seed(42)  # same dropout masks in every run
    tensor_parallel.model_parallel_cuda_manual_seed(42)
    loss = model(ids, None, None, labels=(ids + 1) % 64)
    loss.sum().backward()
    return model.state_dict(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "recompute",
    [
        dict(recompute_granularity="selective"),
        dict(recompute_granularity="selective", recompute_modules=["core_attn", "mlp"]),
        dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
        dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
        dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    ],
    ids=["selective-core_attn", "selective-mlp", "uniform-1", "uniform-2", "block-2"],
)
def test_recompute_gradients_equal_no_recompute(recompute):
    state, ref_loss, ref = _grads(BASE, None)
    _, loss, got = _grads(dataclasses.replace(BASE, **recompute), state)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=name)


def test_dropout_is_active_in_these_runs():
    state, loss_a, _ = _grads(BASE, None)
    _, loss_b, _ = _grads(
        dataclasses.replace(BASE, hidden_dropout=0.0, attention_dropout=0.0), state
    )
    assert not torch.allclose(loss_a, loss_b)
