"""FP8 linears under torch.compile (issue 33), on CPU with Dynamo only (backend "eager"): a whole
FP8 GPT traces as one graph (no graph break in the FP8 autograd function), and compiled layers
share one graph (no per-layer guard: one recipe object, its choices fixed when it is built), for
every recipe. The compiled step gives the eager step's loss."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao.float8")

from gigatron.core import tensor_parallel  # noqa: E402
from gigatron.core.fp8_utils import cpu_takes_rowwise_scales  # noqa: E402
from gigatron.core.models.gpt import GPTModel  # noqa: E402
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec  # noqa: E402
from gigatron.core.transformer.fast_path import compile_transformer_layers  # noqa: E402
from gigatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from tests._one_rank import one_rank_fixtures  # noqa: E402

# the row-wise recipes run on CPU where this torch's CPU _scaled_mm takes per-row scales (2.13)
ROWWISE_ON_CPU = pytest.mark.skipif(
    not cpu_takes_rowwise_scales(), reason="this torch's CPU _scaled_mm takes per-tensor scales"
)
RECIPES = (
    "tensorwise",
    pytest.param("rowwise", marks=ROWWISE_ON_CPU),
    pytest.param("rowwise_with_gw_hp", marks=ROWWISE_ON_CPU),
)
VOCAB, SEQ = 128, 16


gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)  # a one-rank world, torn down


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(recipe, layers=3):
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    cfg = TransformerConfig(
        num_layers=layers,
        hidden_size=32,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        fp8="hybrid",
        fp8_recipe=recipe,
        use_cpu_initialization=True,
    )  # on CPU also where CUDA exists: the batch is on CPU
    return GPTModel(cfg, get_gpt_layer_fast_spec(), VOCAB, SEQ)


def _loss(model, ids, pos):
    return model(ids, pos, None, labels=ids).float().mean()


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, SEQ), generator=g), torch.arange(SEQ).expand(2, SEQ)


def _step(fn, model):
    model.zero_grad(set_to_none=True)
    loss = fn(model, *_batch())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("recipe", RECIPES)
def test_whole_fp8_model_is_one_graph(recipe):
    from torch._dynamo.utils import counters

    counters.clear()
    model = _model(recipe)
    loss, grads = _step(_loss, model)
    compiled = torch.compile(_loss, backend="eager", fullgraph=True)  # a break raises
    loss_c, grads_c = _step(compiled, model)
    _step(compiled, model)  # a second step reuses the graph
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    torch.testing.assert_close(loss_c, loss, rtol=0, atol=0)
    for g, gc in zip(grads, grads_c, strict=True):
        torch.testing.assert_close(gc, g, rtol=0, atol=0)


@pytest.mark.parametrize("recipe", RECIPES)
def test_compiled_fp8_layers_share_one_graph(recipe):
    from torch._dynamo.utils import counters

    counters.clear()
    model = _model(recipe, layers=4)
    loss, _ = _step(_loss, model)
    assert compile_transformer_layers(model, backend="eager") == 4  # fullgraph=True
    loss_c, _ = _step(_loss, model)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"]
    torch.testing.assert_close(loss_c, loss, rtol=0, atol=0)
