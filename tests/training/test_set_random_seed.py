"""gigatron.training.initialize._set_random_seed: Megatron's per-stage seeds and its errors."""

import random

import numpy as np
import pytest
import torch

from gigatron.core.tensor_parallel.random import get_cuda_rng_tracker
from gigatron.training.initialize import _set_random_seed
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


def test_same_seed_same_streams():
    _set_random_seed(123)
    first = (random.random(), np.random.rand(), torch.rand(1))
    _set_random_seed(123)
    assert (random.random(), np.random.rand()) == first[:2]
    assert torch.equal(torch.rand(1), first[2])
    assert get_cuda_rng_tracker().get_states()  # the model-parallel tracker was seeded


def test_group_ranks_shift_the_seed():
    import torch.distributed as dist

    world = dist.group.WORLD  # rank 0 of 1: the same seed as without groups
    _set_random_seed(7, data_parallel_random_init=True, pp_group=world, dp_group=world)
    a = torch.rand(1)
    _set_random_seed(7)
    assert torch.equal(torch.rand(1), a)


@pytest.mark.parametrize("seed", [0, -1, None])
def test_non_positive_seed_is_an_error(seed):
    with pytest.raises(ValueError, match=r"Seed \(.*\) should be a positive integer"):
        _set_random_seed(seed)
