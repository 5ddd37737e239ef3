"""Splitting helpers and vocabulary ranges of gigatron.core.tensor_parallel.utils."""

import pytest
import torch

from gigatron.core.tensor_parallel import VocabUtility, split_tensor_along_last_dim
from gigatron.core.tensor_parallel.utils import divide


def test_split_tensor_along_last_dim():
    x = torch.arange(24.0).view(2, 3, 4)
    parts = split_tensor_along_last_dim(x, 2)
    assert [p.shape for p in parts] == [(2, 3, 2), (2, 3, 2)]
    assert parts[0].data_ptr() == x.data_ptr() and not parts[0].is_contiguous()  # views
    torch.testing.assert_close(torch.cat(parts, dim=-1), x)
    contiguous = split_tensor_along_last_dim(x, 4, contiguous_split_chunks=True)
    assert all(p.is_contiguous() for p in contiguous)
    with pytest.raises(
        ValueError, match=r"last dim \(4\) must be divisible by num_partitions \(3\)"
    ):
        split_tensor_along_last_dim(x, 3)


def test_vocab_utility_ranges():
    assert VocabUtility.vocab_range_from_per_partition_vocab_size(8, 2, 4) == (16, 24)
    assert [VocabUtility.vocab_range_from_global_vocab_size(12, r, 3) for r in range(3)] == [
        (0, 4),
        (4, 8),
        (8, 12),
    ]
    with pytest.raises(ValueError, match=r"vocabulary size \(10\) must be divisible .* \(4\)"):
        VocabUtility.vocab_range_from_global_vocab_size(10, 0, 4)


def test_divide():
    assert divide(12, 4) == 3
    with pytest.raises(ValueError):
        divide(10, 4)
