"""The tensor-parallel mappings, layers and cross entropy on 2 GPUs over NCCL (skipped without
2 CUDA devices): same checks as the gloo tests, tensors on the GPU."""

from __future__ import annotations

import pytest
import torch

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    broadcast_data,
    model_parallel_cuda_manual_seed,
    vocab_parallel_cross_entropy,
)
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import _cases, fwd_bwd_counts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
    pytest.mark.multirank,
]
TOL = dict(rtol=1e-5, atol=1e-5)


def _run_nccl():
    tp = 2
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False

    # Mappings: values, grads and counts (tensors moved to the GPU).
    for name, fn, x, g, want, want_grad, want_fwd, want_bwd in _cases(rank, tp, None):
        x = x.to(dev).requires_grad_(True)
        fwd, bwd, y = fwd_bwd_counts(fn, x, g.to(dev))
        torch.testing.assert_close(y, want.to(dev), **TOL, msg=name)
        torch.testing.assert_close(x.grad, want_grad.to(dev), **TOL, msg=name)
        assert (fwd, bwd) == (want_fwd, want_bwd), (name, fwd, bwd)

    # Column -> Row MLP under sequence parallel, GPU-style init, against nn.Linear.
    model_parallel_cuda_manual_seed(1)
    config = ModelParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=True)
    init = lambda w: torch.nn.init.normal_(w, std=0.1)
    fc1 = ColumnParallelLinear(16, 32, config=config, init_method=init)
    fc2 = RowParallelLinear(
        32, 16, config=config, init_method=init, bias=True, input_is_parallel=True,
        skip_bias_add=False,
    )  # fmt: skip
    assert fc1.weight.is_cuda
    ref1, ref2 = torch.nn.Linear(16, 32).to(dev), torch.nn.Linear(32, 16).to(dev)
    with torch.no_grad():
        for ref in (ref1, ref2):
            ref.weight.normal_(std=0.1)
            ref.bias.normal_()
        torch.distributed.broadcast(ref1.weight, 0)  # same reference on both ranks
        torch.distributed.broadcast(ref2.weight, 0)
        torch.distributed.broadcast(ref1.bias, 0)
        torch.distributed.broadcast(ref2.bias, 0)
        fc1.weight.copy_(ref1.weight.chunk(tp, 0)[rank])
        fc1.bias.copy_(ref1.bias.chunk(tp, 0)[rank])
        fc2.weight.copy_(ref2.weight.chunk(tp, 1)[rank])
        fc2.bias.copy_(ref2.bias)
    x_full = torch.randn(8, 2, 16, device=dev, generator=torch.Generator(dev).manual_seed(3))
    ref_x = x_full.clone().requires_grad_(True)
    ref_y = ref2(torch.relu(ref1(ref_x)))
    ref_y.square().sum().backward()
    x = x_full.chunk(tp, 0)[rank].clone().requires_grad_(True)
    y = fc2(torch.relu(fc1(x)[0]))[0]
    y.square().sum().backward()
    torch.testing.assert_close(y, ref_y.chunk(tp, 0)[rank], **TOL)
    torch.testing.assert_close(x.grad, ref_x.grad.chunk(tp, 0)[rank], **TOL)
    torch.testing.assert_close(fc1.weight.grad, ref1.weight.grad.chunk(tp, 0)[rank], **TOL)
    torch.testing.assert_close(fc2.weight.grad, ref2.weight.grad.chunk(tp, 1)[rank], **TOL)

    # Cross entropy and broadcast_data.
    logits = torch.randn(4, 2, 16, device=dev, generator=torch.Generator(dev).manual_seed(4))
    target = torch.arange(8, device=dev).view(4, 2) * 2
    shard = logits.chunk(tp, -1)[rank].clone()
    loss = vocab_parallel_cross_entropy(shard, target)
    want = torch.nn.functional.cross_entropy(logits.view(-1, 16), target.view(-1), reduction="none")
    torch.testing.assert_close(loss, want.view(4, 2), **TOL)
    data = {"tokens": target} if rank == 0 else {}
    out = broadcast_data(["tokens"], data, torch.int64)
    assert out["tokens"].is_cuda and torch.equal(out["tokens"], target)
    return True


def test_tensor_parallel_on_nccl():
    assert run_distributed(_run_nccl, 2, backend="nccl", timeout=300) == [True, True]
