"""GPTModel picks its loss kernel from cross_entropy_loss_fusion / cross_entropy_fusion_impl
alone, whatever parallel_output is (as Megatron's compute_language_model_loss does): with
parallel_output=False the fused chunked path still runs, and 'native_grad_in_forward' keeps its
contract (gradients in forward, incoming gradient proportional to loss_mask)."""

import pytest
import torch

from gigatron.core.fusions import chunked_cross_entropy
from gigatron.core.models.gpt import gpt_model
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)

V, S, B = 40, 8, 2


def _model(parallel_output, impl=None):
    torch.manual_seed(0)
    fusion = dict(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl=impl) if impl else {}
    config = TransformerConfig(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        **fusion,
    )
    spec = get_gpt_layer_local_spec()
    return GPTModel(config, spec, V, S, parallel_output=parallel_output)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)
    mask = (torch.rand(B, S, generator=g) > 0.3).float()
    return ids, labels, mask


def _loss_and_grads(model, ids, labels, mask):
    loss = model(ids, None, None, labels=labels, loss_mask=mask)  # [b, s]
    ((loss * mask).sum() / mask.sum()).backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("impl", ["native", "native_grad_in_forward"])
def test_fused_path_runs_with_parallel_output_false(impl, monkeypatch):
    calls = []
    fused = chunked_cross_entropy.chunked_linear_cross_entropy

    def spy(*args, **kwargs):
        calls.append(kwargs["grad_in_forward"])
        return fused(*args, **kwargs)

    monkeypatch.setattr(gpt_model, "chunked_linear_cross_entropy", spy)  # the name forward calls
    ids, labels, mask = _batch()
    loss, grads = _loss_and_grads(_model(False, impl), ids, labels, mask)
    assert calls == [impl == "native_grad_in_forward"]
    ref_loss, ref_grads = _loss_and_grads(_model(False), ids, labels, mask)  # plain kernel
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    assert ref_grads["output_layer.weight"].abs().max() > 1e-3


def test_grad_in_forward_contract_holds_with_parallel_output_false():
    """A backward gradient not proportional to loss_mask is refused, as with parallel_output."""
    ids, labels, mask = _batch()
    loss = _model(False, "native_grad_in_forward")(ids, None, None, labels=labels, loss_mask=mask)
    with pytest.raises(RuntimeError, match="proportional to loss_mask"):
        (loss * torch.rand(loss.shape)).sum().backward()
