"""The compiled TP = 2 + SP TransformerLayer keeps its collectives in the form Inductor's async
TP (micro-pipeline TP, `_compile.enable_async_tensor_parallel`) fuses: in the post-grad graphs
the pass sees, every all-gather feeds a matmul (gather dim 0) and every reduce-scatter is fed
by one. The fusion itself needs CUDA symmetric memory (measured in bench/reports); this checks
on CPU that its pattern finder matches all of them: 2 + 2 in the forward graph (QKV / fc1
gathers, proj / fc2 scatters) and 2 + 2 in the backward graph."""

from __future__ import annotations

import shutil

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _patterns() -> list[dict]:
    from torch._inductor import config
    from torch._inductor.fx_passes import micro_pipeline_tp as mp

    from tests.core.models.gpt._parity import tp2_sp_fast_layer

    seen: list[dict] = []

    def inspect(graph: torch.fx.Graph) -> None:
        gathers = mp.find_all_gather_patterns(graph)
        scatters = mp.find_reduce_scatter_patterns(graph)
        seen.append(
            {
                "backward": mp._is_backward(graph),
                "gathers": [
                    (g.gather_dim, len(mp._find_consumer_matmuls(g.res_node))) for g in gathers
                ],
                "scatters": [
                    (r.scatter_dim, mp._find_producer_matmul(r.input_node) is not None)
                    for r in scatters
                ],
            }
        )

    layer = tp2_sp_fast_layer()
    old = config.post_grad_custom_post_pass
    config.post_grad_custom_post_pass = inspect
    try:
        torch._dynamo.reset()
        layer.compile(fullgraph=True)
        x = torch.randn(8, 2, 64, requires_grad=True)  # [s/tp, b, h]
        layer(x, None)[0].sum().backward()
    finally:
        config.post_grad_custom_post_pass = old
    return seen


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_sp_collectives_match_the_async_tp_patterns():
    for seen in run_distributed(_patterns, 2, timeout=600):
        assert sorted(g["backward"] for g in seen) == [False, True], seen
        for graph in seen:
            assert graph["gathers"] == [(0, 1), (0, 1)], graph
            assert graph["scatters"] == [(0, True), (0, True)], graph
