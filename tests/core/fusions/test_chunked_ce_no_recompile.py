"""A model compiled around the chunked cross entropy (`--torch-compile model`) is traced once:
the CE used to fill its cache of compiled helpers while being traced, dynamo guarded on the
cache's contents, and the second call recompiled the whole model (at gpt-1.3b size, a second
full compilation in every training run)."""

import torch

from gigatron.core.fusions.chunked_cross_entropy import _HELPERS, chunked_linear_cross_entropy


def test_compiled_region_around_the_chunked_ce_compiles_once():
    _HELPERS.pop("compiled", None)  # as in a fresh process
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    weight = torch.randn(32, 16, requires_grad=True)  # [V, h]

    @torch.compile(backend=backend)
    def loss_fn(hidden, labels):
        return chunked_linear_cross_entropy(hidden, weight, labels, compiled=True).mean()

    for step in range(3):
        g = torch.Generator().manual_seed(step)
        hidden = torch.randn(8, 2, 16, generator=g, requires_grad=True)  # [s, b, h]
        labels = torch.randint(0, 32, (2, 8), generator=g)  # [b, s]
        loss_fn(hidden, labels).backward()
    assert len(graphs) == 1, f"{len(graphs)} graphs: the compiled region was recompiled"
