"""The multi-rank harness itself: results come back by rank, failures carry the rank's traceback,
and a hung rank fails the call instead of stalling it."""

import time

import pytest
import torch
import torch.distributed as dist

from gigatron.testing import DistributedTestError, run_distributed

pytestmark = pytest.mark.multirank


def _all_reduce_rank():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()


def _hang_on_rank_zero():
    if dist.get_rank() == 0:
        time.sleep(60)
    return "done"


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_results_by_rank(world_size):
    out = run_distributed(_all_reduce_rank, world_size)
    total = sum(range(world_size))
    assert out == [(r, world_size, float(total)) for r in range(world_size)]


def test_failure_reports_rank_and_traceback():
    with pytest.raises(DistributedTestError, match=r"(?s)rank 1 of 2 failed.*boom on purpose"):
        run_distributed(_fail_on_rank_one, 2, timeout=60)


def test_hang_times_out():
    start = time.monotonic()
    with pytest.raises(DistributedTestError, match=r"ranks \[0\] of 2 did not finish"):
        run_distributed(_hang_on_rank_zero, 2, timeout=5)
    assert time.monotonic() - start < 30


def _return_tensor():
    return torch.full((3,), float(dist.get_rank()))


def test_tensors_come_back_by_value():
    out = run_distributed(_return_tensor, 2)
    assert [t.tolist() for t in out] == [[0.0] * 3, [1.0] * 3]
