"""`ModelParallelConfig.tp_comm_overlap` (gigatron's own overlap; Megatron's needs TE) under
sequence parallelism: a ColumnParallelLinear (all-gather pipelined with the matmul) and a
RowParallelLinear (matmul pipelined with the reduce-scatter, a ring of pairwise exchanges)
built with it give the same output, input grad and weight grads as ones built without: bitwise
at TP = 2; at TP = 4 the ring adds the partial sums in another order, so the output differs by
rounding (|difference| / (1 + |value|) <= 1e-6) while the grads (same backward) are bitwise; the
overlapped row-parallel linear traces under torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


S, B, H, F_OUT = 8, 2, 16, 24


def _config(tp: int, overlap: bool) -> ModelParallelConfig:
    return ModelParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=True,
                               use_cpu_initialization=True, tp_comm_overlap=overlap)  # fmt: skip


def _fill(layer, gen) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen))


def _column(tp: int, overlap: bool):
    layer = ColumnParallelLinear(H, F_OUT, config=_config(tp, overlap),
                                 init_method=torch.nn.init.zeros_, bias=True,
                                 gather_output=False)  # fmt: skip
    gen = torch.Generator().manual_seed(7 + parallel_state.get_tensor_model_parallel_rank())
    _fill(layer, gen)
    x = torch.randn(S // tp, B, H, generator=gen, requires_grad=True)  # this rank's [s/tp, b, h]
    out, _ = layer(x)  # [s, b, o/tp]
    out.pow(2).sum().backward()
    return out.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _row(tp: int, overlap: bool, compiled: bool = False):
    layer = RowParallelLinear(H, F_OUT, config=_config(tp, overlap),
                              init_method=torch.nn.init.zeros_, bias=True,
                              input_is_parallel=True, skip_bias_add=False)  # fmt: skip
    gen = torch.Generator().manual_seed(11 + parallel_state.get_tensor_model_parallel_rank())
    _fill(layer, gen)
    x = torch.randn(S, B, H // tp, generator=gen, requires_grad=True)  # [s, b, h/tp]
    forward = torch.compile(layer, fullgraph=True, backend="aot_eager") if compiled else layer
    out, _ = forward(x)  # [s/tp, b, o]
    out.backward(torch.randn(out.shape, generator=gen))  # a fixed grad: equal backward inputs
    return out.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _calls(module, name):
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(module, name, counted)
    return calls


def _compare(tp: int):
    from gigatron.core.tensor_parallel import _linear, layers

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    gathers = _calls(_linear, "_gather_matmul_overlapped")
    column = (_column(tp, False), _column(tp, True))
    assert len(gathers) == 1, "tp_comm_overlap=True did not take the overlapped all-gather"
    scatters = _calls(layers.LinearReduceScatterOverlapped, "forward")
    row = (_row(tp, False), _row(tp, True))
    assert len(scatters) == 1, "tp_comm_overlap=True did not take the overlapped reduce-scatter"
    row_compiled = _row(tp, True, compiled=True)
    errors = {
        kind: [((a - b).abs() / (1 + b.abs())).max().item() for a, b in zip(*pair, strict=True)]
        for kind, pair in (
            ("column", column),
            ("row", row),
            ("row_compiled", (row[0], row_compiled)),
        )
    }
    return errors


def test_tp_comm_overlap_equals_the_plain_sequence_parallel_linears_at_tp2():
    for errors in run_distributed(_compare, 2, args=(2,), timeout=300):
        assert errors["column"] == [0.0] * 4 and errors["row"] == [0.0] * 4, errors
        assert max(errors["row_compiled"]) <= 1e-6, errors


def test_tp_comm_overlap_row_parallel_ring_at_tp4():
    for errors in run_distributed(_compare, 4, args=(4,), timeout=300):
        assert errors["column"] == [0.0] * 4, errors
        # The forward sums in another order (rounding); the backward is the plain path's.
        assert 0 < errors["row"][0] <= 1e-6 and errors["row"][1:] == [0.0] * 3, errors
        assert errors["row_compiled"][0] <= 1e-6 and max(errors["row_compiled"][1:]) <= 1e-6, errors
