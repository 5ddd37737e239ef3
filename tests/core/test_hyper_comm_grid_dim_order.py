"""HyperCommGrid's Megatron-named helpers `_order_dims_for` / `_gen_rank_enum_for`."""

import pytest

from gigatron.core.hyper_comm_grid import HyperCommGrid


@pytest.fixture
def grid(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    return HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])


@pytest.mark.parametrize(
    "dims, ordered, key",
    [
        ("cp", ["cp"], "cp"),
        (["dp", "tp"], ["dp", "tp"], "dp-tp"),
        (["tp", "dp"], ["dp", "tp"], "dp-tp"),
        (["tp", "cp", "dp"], ["dp", "cp", "tp"], "dp-cp-tp"),
    ],
)
def test_order_dims_for_sorts_by_reversed_dim_names(grid, dims, ordered, key):
    assert grid._order_dims_for(grid.dim_names, dims) == (ordered, key)


def test_gen_rank_enum_for_groups_last_dim_fastest(grid):
    # dims [a, b] of names a b c: groups per c, b-major inside a group.
    assert grid._gen_rank_enum_for([2, 2, 2], ["a", "b", "c"], ["a", "b"]) == [
        [0, 2, 1, 3],
        [4, 6, 5, 7],
    ]
    assert grid._gen_rank_enum_for([2, 2, 2], ["a", "b", "c"], ["c"]) == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
    ]
