"""Matmuls in the forward and backward graphs of GPTModel's chunked cross entropy under
torch.compile (AOT autograd, the default min-cut partitioner; aot_eager-style capture, CPU).

    python bench/gpt/count_ce_matmuls.py

Per mode of `chunked_linear_cross_entropy` (2 chunks): `recompute` (what GPTModel runs with
`cross_entropy_fusion_impl='native'`), `keep` (the [N, V] logit gradient kept), `grad_in_forward`
('native_grad_in_forward'). Eager, `recompute` runs 2 + 6 matmuls; compiled, AOT autograd
deduplicates the backward's logits recompute with the forward's matmul (the graphs keep each
chunk's logits instead), which is why `grad_in_forward` is no faster when compiled.
"""

from __future__ import annotations

import os
import sys

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from gigatron.core.fusions.chunked_cross_entropy import chunked_linear_cross_entropy  # noqa: E402


def count(mode: str) -> dict:
    graphs = []

    def backend(gm, example_inputs):
        def keep(kind):
            def compiler(g, _inputs):
                graphs.append((kind, g))
                return g.forward

            return compiler

        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=keep("forward"),
            bw_compiler=keep("backward"),
            partition_fn=min_cut_rematerialization_partition,
        )

    kw = {"chunk_size": 64, "compiled": False}
    kw.update({"recompute": {"recompute": True}, "keep": {}}.get(mode, {"grad_in_forward": True}))

    def loss(x, w, labels):
        return chunked_linear_cross_entropy(x, w, labels, **kw).mean()

    x = torch.randn(32, 4, 16, requires_grad=True)  # [s, b, h]: 128 tokens, 2 chunks
    w = torch.randn(100, 16, requires_grad=True)
    labels = torch.randint(0, 100, (4, 32))
    torch.compile(loss, backend=backend)(x, w, labels).backward()
    out = {}
    for kind, g in graphs:
        mms = [n for n in g.graph.nodes if n.op == "call_function" and "mm" in str(n.target)]
        out[kind] = out.get(kind, 0) + len(mms)
    return out


if __name__ == "__main__":
    for mode in ("recompute", "keep", "grad_in_forward"):
        print(mode, count(mode))
