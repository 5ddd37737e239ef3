"""GPTModel(parallel_output=False) with labels on TP = 2 gloo ranks: the per-token loss is the
full-vocabulary cross entropy of the logits it returns, and loss and every gradient equal the
parallel_output=True model's, with the plain and the fused (chunked) loss kernels.

Megatron feeds the gathered [s, b, V] logits to vocab_parallel_cross_entropy, which reads them as
a V-wide shard per rank: the loss comes out log(tp) too high there (gigatron differs on purpose)."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, S, B = 32, 8, 2


def _model(parallel_output, fusion):
    torch.manual_seed(0)  # CPU initialisation: the same full weights, sharded, in every model
    config = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        tensor_model_parallel_size=2,
        cross_entropy_loss_fusion=fusion,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    spec = get_gpt_layer_local_spec()
    return GPTModel(config, spec, V, S, parallel_output=parallel_output)


def _loss_and_grads(model, ids, labels):
    loss = model(ids, None, None, labels=labels)  # [b, s]
    loss.mean().backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _worker(fusion):
    parallel_state.initialize_model_parallel(2)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)
    model = _model(False, fusion)
    with torch.no_grad():
        logits = model(ids, None, None)  # [b, s, V]: gathered
    assert logits.shape == (B, S, V)
    loss, grads = _loss_and_grads(model, ids, labels)
    ref = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, ref.view(B, S), rtol=1e-5, atol=1e-5)
    ref_loss, ref_grads = _loss_and_grads(_model(True, fusion), ids, labels)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name, ref_grad in ref_grads.items():
        torch.testing.assert_close(grads[name], ref_grad, rtol=1e-5, atol=1e-6, msg=name)
    assert ref_grads["output_layer.weight"].abs().max() > 1e-3


@pytest.mark.parametrize("fusion", [False, True])
def test_parallel_output_false_loss_is_full_vocab_cross_entropy(fusion):
    run_distributed(_worker, 2, args=(fusion,), timeout=120)
