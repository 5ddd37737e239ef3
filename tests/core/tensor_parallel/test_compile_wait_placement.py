"""Where Inductor puts the waits of a compiled TP = 2 + SP layer's backward collectives.

The linears' backward starts the input-gradient reduce-scatter, then runs the weight-gradient
matmul, then waits (tensor_parallel/_linear.py), so the transfer hides behind the matmul.
Inductor's default peak-memory reordering moves that matmul after the wait (the collective
then runs alone: bench/reports/gpt-tensor-parallel.md). With `reorder_for_peak_memory=False`
(bench_gpt.py --no-memory-reorder) the generated backward keeps a matmul between every
reduce-scatter and its wait; this checks that schedule in the generated code on CPU."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _codes(peak_memory_reorder: bool | None, tp_comm_overlap: bool = False) -> list[str]:
    """Generated code of one compiled TP = 2 + SP layer (forward, backward). `None`: no
    Inductor patch, the layer compiled by `compile_transformer_layers` (its own choice)."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    from tests.core.models.gpt._parity import tp2_sp_fast_layer

    layer = tp2_sp_fast_layer(tp_comm_overlap=tp_comm_overlap)
    torch._dynamo.reset()
    x = torch.randn(8, 2, 64, requires_grad=True)  # [s/tp, b, h]

    def step():
        layer(x, None)[0].sum().backward()

    if peak_memory_reorder is None:
        from gigatron.core.transformer.fast_path import compile_transformer_layers

        compile_transformer_layers(layer)
        _, codes = run_and_get_code(step)
    else:
        layer.compile(fullgraph=True)
        with config.patch(reorder_for_peak_memory=peak_memory_reorder):
            _, codes = run_and_get_code(step)
    assert len(codes) == 2 and "tangents_1" in codes[1], len(codes)
    return codes


def _backward_code(peak_memory_reorder: bool) -> str:
    return _codes(peak_memory_reorder)[1]


def _ops_between_scatter_and_wait(code: str, op: str = "reduce_scatter_tensor") -> list[list[str]]:
    """For each collective `op` in the generated code: the extern matmuls launched before its
    wait_tensor."""
    lines = [ln.strip() for ln in code.splitlines()]
    out = []
    for i, line in enumerate(lines):
        m = re.match(rf"(buf\d+) = torch\.ops\._c10d_functional\.{op}", line)
        if not m:
            continue
        between = []
        for later in lines[i + 1 :]:
            if later.startswith(f"torch.ops._c10d_functional.wait_tensor.default({m.group(1)})"):
                break
            if later.startswith("extern_kernels.mm("):
                between.append(later)
        out.append(between)
    return out


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_without_peak_memory_reorder_a_matmul_hides_each_reduce_scatter():
    for code in run_distributed(_backward_code, 2, args=(False,), timeout=600):
        hidden = _ops_between_scatter_and_wait(code)
        assert len(hidden) == 2, hidden  # fc1's and QKV's input gradients
        assert all(len(mms) >= 1 for mms in hidden), hidden


def _overlap_schedule():
    forward, backward = _codes(None, tp_comm_overlap=True)
    return (
        _ops_between_scatter_and_wait(forward, "all_gather_into_tensor"),
        _ops_between_scatter_and_wait(forward, "all_to_all_single"),
        _ops_between_scatter_and_wait(backward),
        _ops_between_scatter_and_wait(backward, "all_gather_into_tensor"),
    )


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_tp_comm_overlap_layers_hide_every_forward_and_backward_collective():
    """`tp_comm_overlap` + `compile_transformer_layers`: in the forward, a matmul runs under
    each all-gather (this rank's rows) and each reduce-scatter exchange (this rank's block);
    in the backward, under each input-gradient reduce-scatter (QKV, fc1: the weight-gradient
    matmul) and each grad all-gather of the row-parallel linears (proj, fc2: this rank's rows
    of the input gradient)."""
    for gathers, exchanges, scatters, bwd_gathers in run_distributed(
        _overlap_schedule, 2, timeout=600
    ):
        assert len(gathers) == 2 and all(gathers), gathers  # QKV, fc1
        assert len(exchanges) == 2 and all(exchanges), exchanges  # proj, fc2
        assert len(scatters) == 2 and all(scatters), scatters
        assert len(bwd_gathers) == 2 and all(bwd_gathers), bwd_gathers
