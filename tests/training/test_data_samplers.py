"""The pretraining sampler: DP slicing and exact continuation from consumed_samples."""

import pytest

from gigatron.training.data_samplers import MegatronPretrainingSampler


def test_dp_ranks_take_consecutive_slices():
    batches = [list(MegatronPretrainingSampler(20, 0, 2, rank, 2)) for rank in range(2)]
    assert batches[0][:3] == [[0, 1], [4, 5], [8, 9]]
    assert batches[1][:3] == [[2, 3], [6, 7], [10, 11]]


def test_resume_continues_exactly():
    full = list(MegatronPretrainingSampler(40, 0, 2, 1, 2))
    resumed = list(MegatronPretrainingSampler(40, 12, 2, 1, 2))
    assert resumed == full[3:]


def test_errors_name_values():
    with pytest.raises(ValueError, match=r"consumed_samples \(10\) >= total_samples \(10\)"):
        MegatronPretrainingSampler(10, 10, 2, 0, 1)
    with pytest.raises(ValueError, match="data_parallel_rank=2"):
        MegatronPretrainingSampler(10, 0, 2, 2, 2)
