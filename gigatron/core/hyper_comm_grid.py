"""N-dimensional communication grid: process groups over any named subset of its axes.

Mirrors `megatron.core.hyper_comm_grid.HyperCommGrid`. `dim_names` has the meaning of
`initialize_model_parallel`'s `order`: the first name varies fastest (adjacent ranks), so
`HyperCommGrid([2, 3, 4, 5], ["tp", "cp", "pp", "dp"])` lays ranks out as order "tp-cp-pp-dp".
`create_pg(dims)` builds the groups spanning `dims` (every rank takes part, as in any
torch.distributed group creation) and returns this rank's; `get_pg(dims)` returns it again.
Megatron computes the enumeration with einops; here it is a NumPy transpose (no extra dependency).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch.distributed as dist

__all__ = ["HyperCommGrid"]


class HyperCommGrid:
    """Named axes `dim_names` of sizes `shape` over ranks rank_offset .. rank_offset + prod - 1."""

    def __init__(
        self,
        shape: list[int],
        dim_names: list[str],
        rank_offset: int = 0,
        backend: str | None = None,
    ) -> None:
        if len(shape) != len(dim_names):
            raise ValueError(
                f"len(shape) {shape} != len(dim_names) {dim_names} "
                "(gigatron/core/hyper_comm_grid.py)"
            )
        if "WORLD_SIZE" in os.environ:
            world_size = int(os.environ["WORLD_SIZE"])
        elif dist.is_initialized():
            world_size = dist.get_world_size()
        else:
            raise RuntimeError(
                "HyperCommGrid cannot determine the world size: set WORLD_SIZE or initialize "
                "torch.distributed first"
            )
        if rank_offset < 0:
            raise ValueError(f"rank_offset must be non-negative, got {rank_offset}")
        self.rank_offset = rank_offset
        self.size = math.prod(shape)
        if self.size > world_size - rank_offset:
            raise RuntimeError(
                f"Grid shape {shape} is over sized with world size {world_size} and rank "
                f"offset {rank_offset}"
            )
        self.shape = list(shape)
        self.dim_names = list(dim_names)
        self.backend = backend
        self._pgs: dict[str, Any] = {}

    def create_pg(self, dims: str | list[str], **kwargs: Any):
        """Create the groups spanning `dims` (collective over the world) and return this rank's
        (None when this rank is outside the grid). `kwargs` go to
        `torch.distributed.new_subgroups_by_enumeration` (timeout, pg_options, group_desc).
        KeyError if these dims already have groups."""
        ordered, key = self._order_dims(dims)
        if key in self._pgs:
            raise KeyError(
                f"Process group {dims} has already been created; options cannot be compared, "
                "so it is not created twice"
            )
        pg, _ = dist.new_subgroups_by_enumeration(
            self._gen_rank_enum(ordered), backend=self.backend, **kwargs
        )
        self._pgs[key] = pg
        return pg

    def get_pg(self, dims: str | list[str]):
        """This rank's group over `dims`, made by an earlier `create_pg` (KeyError otherwise)."""
        _, key = self._order_dims(dims)
        if key not in self._pgs:
            raise KeyError(f"Process group for {key} hasn't been created. Call create_pg first.")
        return self._pgs[key]

    def get_rank_enum(self, dims: str | list[str]) -> list[list[int]]:
        """The rank lists `create_pg(dims)` would use, one per group."""
        ordered, _ = self._order_dims(dims)
        return self._gen_rank_enum(ordered)

    def _gen_rank_enum(self, dims: list[str]) -> list[list[int]]:
        """Groups over `dims` (the last of `dims` varies fastest inside a group), e.g. shape
        [2, 2, 2], names a b c: dims [a, b] -> [[0, 2, 1, 3], [4, 6, 5, 7]]; create_pg passes
        `dims` sorted by `_order_dims` ([b, a] -> [[0, 1, 2, 3], [4, 5, 6, 7]])."""
        reverse = self.dim_names[::-1]  # numpy's C order: the slowest axis first
        remaining = [d for d in reverse if d not in dims]
        sizes = dict(zip(self.dim_names, self.shape))
        grid = np.arange(self.rank_offset, self.rank_offset + self.size).reshape(
            [sizes[d] for d in reverse]
        )
        grid = grid.transpose([reverse.index(d) for d in remaining + list(dims)])
        group_size = math.prod(sizes[d] for d in dims)
        return grid.reshape(-1, group_size).tolist()

    def _order_dims(self, dims: str | list[str]) -> tuple[list[str], str]:
        """`dims` sorted by the reversed `dim_names`, and the key naming the group."""
        if not isinstance(dims, list):
            ordered = [dims]
        else:
            reverse = self.dim_names[::-1]
            ordered = [reverse[i] for i in sorted(reverse.index(d) for d in dims)]
        return ordered, "-".join(ordered)
