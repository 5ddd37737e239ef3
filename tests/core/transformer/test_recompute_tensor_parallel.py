"""With TP = 2 and sequence parallelism, dropout on: selective and full recompute reproduce the
no-recompute loss and gradients (the RNG tracker fork is replayed inside the checkpoints)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _grads(config, state):
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = GPTModel(config, get_gpt_layer_local_spec(), 64, 16, position_embedding_type="rope")
    if state is not None:
        model.load_state_dict(state)
    ids = torch.arange(16).view(2, 8) * 3 % 64
    torch.manual_seed(9)
    tensor_parallel.model_parallel_cuda_manual_seed(9)
    loss = model(ids, None, None, labels=(ids + 1) % 64)
    loss.sum().backward()
    return model.state_dict(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _body():
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(2)
    base = TransformerConfig(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=32,
        gated_linear_unit=True,
        activation_func=F.silu,
        hidden_dropout=0.3,
        attention_dropout=0.3,
        use_cpu_initialization=True,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
    )
    state, ref_loss, ref = _grads(base, None)
    _, no_dropout_loss, _ = _grads(
        dataclasses.replace(base, hidden_dropout=0.0, attention_dropout=0.0), state
    )
    assert not torch.allclose(ref_loss, no_dropout_loss)
    for recompute in (
        dict(recompute_granularity="selective", recompute_modules=["core_attn", "mlp"]),
        dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    ):
        _, loss, got = _grads(dataclasses.replace(base, **recompute), state)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=name)
    return True


def test_recompute_with_tp_and_sequence_parallel():
    assert run_distributed(_body, 2, timeout=180) == [True, True]
