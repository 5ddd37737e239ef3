"""`ModelParallelConfig.tp_comm_overlap` (gigatron's own overlap; Megatron's needs TE): a
sequence-parallel ColumnParallelLinear built with it gives the same output, input grad and
weight grads as one built without (2 gloo ranks, fp32, bitwise)."""

from __future__ import annotations

import torch

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import ColumnParallelLinear
from gigatron.testing import run_distributed

S, B, H, F_OUT = 8, 2, 16, 24


def _run(overlap: bool):
    cfg = ModelParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True,
                              use_cpu_initialization=True, tp_comm_overlap=overlap)  # fmt: skip
    layer = ColumnParallelLinear(H, F_OUT, config=cfg, init_method=torch.nn.init.zeros_,
                                 bias=True, gather_output=False)  # fmt: skip
    gen = torch.Generator().manual_seed(7 + parallel_state.get_tensor_model_parallel_rank())
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen))
    x = torch.randn(S // 2, B, H, generator=gen, requires_grad=True)  # this rank's [s/tp, b, h]
    out, _ = layer(x)  # [s, b, o/tp]
    out.pow(2).sum().backward()
    return out.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _compare():
    from gigatron.core.tensor_parallel import _linear

    calls = []
    original = _linear._gather_matmul_overlapped

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    _linear._gather_matmul_overlapped = counted
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    plain = _run(False)
    assert not calls
    overlapped = _run(True)
    assert calls, "tp_comm_overlap=True did not take the overlapped path"
    return [torch.equal(a, b) for a, b in zip(plain, overlapped)]


def test_tp_comm_overlap_equals_the_plain_sequence_parallel_linear():
    for rank_result in run_distributed(_compare, 2, timeout=120):
        assert rank_result == [True, True, True, True]
