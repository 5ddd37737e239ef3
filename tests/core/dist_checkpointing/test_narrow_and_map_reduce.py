"""ShardedTensor.narrow shrinks each rank's box and the global tensor alike (saved narrowed on
2 "ranks", the pieces tile the narrowed global tensor); dict_utils.map_reduce groups and
reduces."""

import pytest
import torch

from gigatron.core.dist_checkpointing import ShardedTensor
from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.dict_utils import map_reduce


def test_narrow_scales_global_shape_and_offset():
    data = torch.arange(1 * 3 * 7 * 9.0).reshape(1, 3, 7, 9)
    sh = ShardedTensor.from_rank_offsets("k", data, (0, 0, 10), (2, 3, 6))
    (a,) = sh.narrow(1, 1, 2)
    assert (a.local_shape, a.global_shape, a.global_offset) == (
        (1, 2, 7, 9),
        (10, 2, 42, 9),
        (0, 0, 21, 0),
    )
    torch.testing.assert_close(a.data, data[:, 1:3])
    (b,) = sh.narrow(2, 3, 2)
    assert (b.global_shape, b.global_offset) == ((10, 3, 12, 9), (0, 0, 6, 0))


def test_narrowed_boxes_of_all_ranks_tile_the_narrowed_tensor():
    full = torch.arange(24.0).reshape(4, 6)  # 2 ranks split dim 0; keep columns 1..3 of each
    out = torch.full((4, 3), float("nan"))
    for rank in range(2):
        local = full[2 * rank : 2 * rank + 2, 0:6]
        sh = ShardedTensor.from_rank_offsets("k", local, (0, rank, 2))
        (n,) = sh.narrow(1, 1, 3)
        out[n.global_slice()] = n.data
    torch.testing.assert_close(out, full[:, 1:4])


def test_narrow_refuses_ranges_outside_the_box_and_irregular_grids():
    sh = ShardedTensor.from_rank_offsets("k", torch.zeros(4, 6), (0, 1, 2))
    with pytest.raises(CheckpointingException, match="must lie within"):
        sh.narrow(1, 4, 3)
    odd = ShardedTensor("k", torch.zeros(3), torch.float32, (3,), (5,), (2,), None)
    with pytest.raises(CheckpointingException, match="regular grid"):
        odd.narrow(0, 0, 1)


def test_map_reduce_groups_by_key_then_reduces():
    words = ["apple", "avocado", "banana", "blueberry", "cherry"]
    assert map_reduce(words, key_fn=lambda w: w[0], value_fn=len, reduce_fn=sum) == {
        "a": 12, "b": 15, "c": 6,
    }  # fmt: skip
    assert map_reduce([1, 2, 1]) == {1: [1, 1], 2: [2]}
