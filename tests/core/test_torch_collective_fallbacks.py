"""gigatron must run on torch 2.11, whose torch.distributed has no `all_gather_single` /
`reduce_scatter_single` (torch >= 2.12 names; CI runs a newer torch): the distributed optimizer
on DP = 2 gloo ranks, with overlapped grad reduce-scatter and param all-gather, gives the same
params with those names removed as with them; and no module calls them directly."""

import re

import pytest
import torch
import torch.distributed as dist

from gigatron.testing import run_distributed
from tests._paths import REPO

pytestmark = pytest.mark.multirank


_NEW_NAMES = ("all_gather_single", "reduce_scatter_single")


def _train(hide_new_names: bool):
    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.model_parallel_config import ModelParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if hide_new_names:
        for name in _NEW_NAMES:
            if hasattr(dist, name):
                delattr(dist, name)
    ps.initialize_model_parallel()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        bucket_size=64,
    )
    ddp = DistributedDataParallel(ModelParallelConfig(), ddp_config, model)
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-2, use_distributed_optimizer=True, clip_grad=1.0), [ddp]
    )
    gen = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(3):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        ddp.finish_grad_sync()
        assert opt.step()[0]
    ddp(torch.zeros(1, 8))  # the forward pre-hooks wait for the overlapped param all-gather
    return [p.detach().clone() for p in model.parameters()]


def test_distributed_optimizer_without_the_torch_2_12_collective_names():
    want = run_distributed(_train, 2, args=(False,), timeout=120)
    got = run_distributed(_train, 2, args=(True,), timeout=120)
    for rank_got, rank_want in zip(got, want, strict=True):
        for a, b in zip(rank_got, rank_want, strict=True):
            assert torch.equal(a, b)
    moved = [(a - b).abs().max() for a, b in zip(got[0], _initial())]
    assert max(moved) > 0


def _initial():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return [p.detach() for p in model.parameters()]


def test_no_module_calls_the_new_names_directly():
    root = REPO / "gigatron"
    pattern = re.compile(r"\bdist\.(" + "|".join(_NEW_NAMES) + r")\(")
    hits = [
        f"{path.relative_to(root.parent)}:{i}"
        for path in root.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, f"call them through getattr with the torch 2.11 fallback: {hits}"


def test_tp_mappings_never_end_in_a_no_op_contiguous():
    """torch 2.11 compiles an autograd.Function whose forward or backward ends in `.contiguous()`
    of an already contiguous tensor into zero input grads (the TP mappings' split and gather:
    tests/core/tensor_parallel/test_compile.py failed there); the mappings call `_contiguous`
    instead, which copies only non-contiguous tensors."""
    from gigatron.core.tensor_parallel._collectives import _contiguous

    root = REPO / "gigatron" / "core" / "tensor_parallel"
    calls = [
        line.strip()
        for name in ("_collectives.py", "mappings.py")
        for line in (root / name).read_text().splitlines()
        if ".contiguous()" in line and not line.lstrip().startswith(('"""', "#"))
    ]
    assert calls == ["return x if x.is_contiguous() else x.contiguous()"], calls
    t = torch.ones(4, 6)
    assert _contiguous(t) is t
    assert _contiguous(t[:, :3]).is_contiguous() and _contiguous(t[:, :3]) is not t
