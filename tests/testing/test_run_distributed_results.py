"""run_distributed end to end: a rank returning a class outside the allow-list fails the call
with the class named; `safe_globals` lets a trusted class through; tensors come back."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from gigatron.testing import DistributedTestError, run_distributed

pytestmark = pytest.mark.multirank


@dataclasses.dataclass
class RankReport:
    rank: int
    total: torch.Tensor


def _report():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return RankReport(rank=dist.get_rank(), total=t)


def test_unlisted_class_is_refused_with_its_name():
    with pytest.raises(
        DistributedTestError,
        match=r"(?s)rank \d of 2 returned a value.*RankReport.*safe_globals=\[",
    ):
        run_distributed(_report, 2, timeout=60)


def test_safe_globals_allows_a_trusted_class():
    out = run_distributed(_report, 2, timeout=60, safe_globals=[RankReport])
    assert [r.rank for r in out] == [0, 1]
    assert [r.total.tolist() for r in out] == [[3.0], [3.0]]
