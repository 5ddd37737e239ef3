"""compile_transformer_layers(layers_per_graph=N): runs of N consecutive TransformerLayers as
one compiled graph each, on a TP = 2 + SP GPTModel over 2 gloo ranks. Loss and every grad equal
the eager model's (fp32); 5 layers in groups of 2 give 3 graphs (2 + 2 + 1) with the SP
collectives inside them; the full-recompute path still runs the layers one by one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.fast_path import compile_transformer_layers, parse_layers_per_graph
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_compile import (
    TOL,
    TP,
    B,
    S,
    V,
    _compare,
    _fwd_bwd,
    _gpt_config,
    _Recorder,
)

pytestmark = pytest.mark.multirank


def _model(num_layers):
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    return GPTModel(_gpt_config(True, num_layers), get_gpt_layer_fast_spec(), V, S)


def _body(backend, sizes):
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(TP)
    model = _model(5)
    g = torch.Generator().manual_seed(3)
    ids, labels = (torch.randint(0, V, (B, S), generator=g) for _ in range(2))

    def loss(ids, labels):
        return model(ids, None, None, labels=labels)  # [b, s]

    params = list(model.named_parameters())
    eager = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    recorder = _Recorder(backend)
    assert compile_transformer_layers(model, layers_per_graph=sizes, backend=recorder) == 5
    compiled = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    err = _compare(eager, compiled, f"layers_per_graph={sizes} ({backend})")
    # Each compiled group is one dynamo graph; a second step reuses them (no recompile).
    _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    graphs = recorder.num_graphs
    collectives = recorder.collectives

    # The whole model compiled around the groups (bench --compile model --layers-per-graph):
    # its graphs stop before the first group and resume after the last; same numbers.
    outer = _Recorder(backend)
    whole = torch.compile(loss, backend=outer)
    around = _fwd_bwd(whole, params, [ids, labels], 99, grad_scale=1 / (B * S))
    err = max(err, _compare(eager, around, "whole model compiled around the groups"))
    assert recorder.num_graphs == graphs, (recorder.num_graphs, graphs)  # groups reused
    outer_graphs = outer.num_graphs
    outer_ops = {op for seq in outer.sequences.values() for op in seq}

    # Full recompute runs the layers through tensor_parallel.checkpoint, not the groups: it
    # still gives the eager numbers.
    model.config.recompute_granularity, model.config.recompute_method = "full", "uniform"
    model.config.recompute_num_layers = 1
    recomputed = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    err = max(err, _compare(eager, recomputed, "full recompute with groups set"))
    # One checkpointed chunk of all 5 layers: still the plain loop, no group graph compiled.
    model.config.recompute_num_layers = 5
    recomputed = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    err = max(err, _compare(eager, recomputed, "full recompute of one 5-layer chunk"))
    assert recorder.num_graphs == graphs, ("groups ran under full recompute", recorder.num_graphs)
    return err, graphs, sorted(collectives), outer_graphs, "embedding" in str(outer_ops)


@pytest.mark.parametrize("sizes,expected_graphs", [(2, 3), ([1, 4], 2)])
def test_layer_groups_match_eager(sizes, expected_graphs):
    err, graphs, collectives, outer_graphs, outer_has_embedding = run_distributed(
        _body, TP, args=("aot_eager", sizes), timeout=240
    )[0]
    print(f"max |c - e| / (1 + |e|): {err}; graphs {graphs}; collectives {collectives}")
    print(f"graphs of the whole model compiled around the groups: {outer_graphs}")
    assert outer_graphs >= 2, outer_graphs  # before the groups and after them, not through them
    assert outer_has_embedding, "the outer graphs should hold the embedding lookup"
    assert err <= TOL["rtol"], err
    assert graphs == expected_graphs, graphs
    assert "c10d.all_gather_into_tensor" in collectives, collectives
    assert "c10d.reduce_scatter_tensor" in collectives, collectives


@pytest.mark.parametrize("bad", [0, -1, [], [2, 0], True, "6", 1.5])
def test_layers_per_graph_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match=r"layers_per_graph .* must be an int >= 1"):
        compile_transformer_layers(torch.nn.Linear(2, 2), layers_per_graph=bad)


def _errors():
    parallel_state.initialize_model_parallel(1)
    messages = []
    for sizes, recompute in [
        ([1, 1], {}),
        (3, dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
    ]:
        cfg = replace(_gpt_config(False, 3), tensor_model_parallel_size=1, **recompute)
        model = GPTModel(cfg, get_gpt_layer_fast_spec(), V, S)
        with pytest.raises(ValueError) as info:
            compile_transformer_layers(model, layers_per_graph=sizes)
        messages.append(str(info.value))
    return messages


def test_layer_groups_refuse_bad_sizes_and_full_recompute():
    sizes, recompute = run_distributed(_errors, 1, timeout=120)[0]
    assert "[1, 1] adds up to 2, but the block has 3 layers" in sizes, sizes
    assert "[3] with recompute_granularity='full'" in recompute, recompute


def test_parse_layers_per_graph():
    assert parse_layers_per_graph("6") == 6
    assert parse_layers_per_graph("4,20") == [4, 20]
    with pytest.raises(ValueError, match=r"layers per graph \('4;20'\) must be an int"):
        parse_layers_per_graph("4;20")
