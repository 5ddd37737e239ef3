"""N-dimensional communication grid: process groups over any named subset of its axes.

Mirrors `megatron.core.hyper_comm_grid.HyperCommGrid` (megatron-core 0.19). `dim_names` has the
meaning of `initialize_model_parallel`'s `order`: the first name varies fastest (adjacent ranks),
so `HyperCommGrid([2, 3, 4, 5], ["tp", "cp", "pp", "dp"])` lays ranks out as order "tp-cp-pp-dp".
`create_pg(dims)` builds the groups spanning `dims` (every rank takes part, as in any
torch.distributed group creation) and returns this rank's; `get_pg(dims)` returns it again.

Views: `register_view(name, shape, dim_names, shared_dims)` adds another factorization of the same
ranks (e.g. an expert layout [etp, ep, edp] beside the dense [tp, dp]); `create_pg / get_pg /
get_rank_enum(dims, view=name)` then work in it. Dims listed in `shared_dims` must enumerate the
same groups in both views (checked at registration), and a group over shared dims only is the
base view's own group: created once, found from either view.
Megatron computes the enumeration with einops / NumPy moveaxis; here it is a NumPy transpose.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

__all__ = ["HyperCommGrid"]

_BASE_VIEW_NAME = "base"


@dataclass
class _RankViewSpec:
    """A named factorization of the grid's ranks."""

    name: str
    shape: list[int]
    dim_names: list[str]
    shared_dims: list[str]


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
            raise ValueError(f"len(shape) {shape} != len(dim_names) {dim_names}")
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
        base = _RankViewSpec(_BASE_VIEW_NAME, self.shape[:], self.dim_names[:], shared_dims=[])
        self._views: dict[str, _RankViewSpec] = {_BASE_VIEW_NAME: base}
        # Base-view groups are keyed "dp-tp"; a view's own groups (view_name, ("dp", "tp")).
        self._pgs: dict[str | tuple[str, tuple[str, ...]], Any] = {}

    def register_view(
        self,
        name: str,
        shape: list[int],
        dim_names: list[str],
        shared_dims: list[str] | None = None,
    ) -> None:
        """Add a factorization `shape` / `dim_names` of this grid's ranks. Each dim of
        `shared_dims` (and the set of them together) must enumerate the same groups as in the
        base view; ValueError otherwise, or for a repeated name, a size mismatch, bad shapes."""
        if name in self._views:
            raise ValueError(f"View {name!r} is already registered")
        if len(shape) != len(dim_names):
            raise ValueError(f"len(shape) {shape} != len(dim_names) {dim_names}")
        if len(set(dim_names)) != len(dim_names):
            raise ValueError(f"View {name!r} has duplicate dim_names: {dim_names}")
        if any(not isinstance(s, numbers.Integral) or s <= 0 for s in shape):
            raise ValueError(f"View {name!r} shape must be positive ints, got {shape}")
        if math.prod(shape) != self.size:
            raise ValueError(
                f"View {name!r} shape {shape} has size {math.prod(shape)}, but the grid size is "
                f"{self.size}"
            )
        shared_dims = list(shared_dims or [])
        if len(set(shared_dims)) != len(shared_dims):
            raise ValueError(f"View {name!r} has duplicate shared_dims: {shared_dims}")
        for dim in shared_dims:
            if dim not in self.dim_names:
                raise ValueError(
                    f"Shared dim {dim!r} of view {name!r} is not in the base view {self.dim_names}"
                )
            if dim not in dim_names:
                raise ValueError(
                    f"Shared dim {dim!r} of view {name!r} is not in the view's dim_names "
                    f"{dim_names}"
                )
        checks = [[d] for d in shared_dims] + ([shared_dims] if len(shared_dims) > 1 else [])
        for dims in checks:
            base_enum = self._enum_for(self.shape, self.dim_names, dims)
            view_enum = self._enum_for(shape, dim_names, dims)
            if base_enum != view_enum:
                label = f"Shared dim {dims[0]!r}" if len(dims) == 1 else f"Shared dims {dims!r}"
                raise ValueError(
                    f"{label} has different membership across views: base enumeration "
                    f"{base_enum} != view {name!r} enumeration {view_enum}"
                )
        self._views[name] = _RankViewSpec(name, list(shape), list(dim_names), shared_dims)

    def create_pg(self, dims: str | list[str], *, view: str | None = None, **kwargs: Any):
        """Create the groups spanning `dims` (collective over the world) and return this rank's
        (None when this rank is outside the grid). `kwargs` go to
        `torch.distributed.new_subgroups_by_enumeration` (timeout, pg_options, group_desc).
        KeyError if these dims already have groups (in this view, or in the base view for
        shared dims)."""
        key, enum_view, enum_dims = self._key(dims, view)
        if key in self._pgs:
            where = "" if isinstance(key, str) else f" for view {key[0]!r}"
            raise KeyError(
                f"Process group {dims}{where} has already been created; options cannot be "
                "compared, so it is not created twice"
            )
        rank_enum = self._enum_for(enum_view.shape, enum_view.dim_names, enum_dims)
        pg, _ = dist.new_subgroups_by_enumeration(rank_enum, backend=self.backend, **kwargs)
        self._pgs[key] = pg
        return pg

    def get_pg(self, dims: str | list[str], *, view: str | None = None):
        """This rank's group over `dims`, made by an earlier `create_pg` (KeyError otherwise)."""
        key, _, _ = self._key(dims, view)
        if key not in self._pgs:
            where = "" if isinstance(key, str) else f" for view {key[0]!r}"
            raise KeyError(
                f"Process group {dims}{where} hasn't been created. Call create_pg first."
            )
        return self._pgs[key]

    def get_rank_enum(self, dims: str | list[str], *, view: str | None = None) -> list[list[int]]:
        """The rank lists `create_pg(dims, view=view)` would use, one per group."""
        spec = self._view(view)
        return self._enum_for(spec.shape, spec.dim_names, self._ordered(spec, dims))

    def destroy(self) -> None:
        """Destroy every group of this grid that this rank belongs to (each once)."""
        done: set[int] = set()
        non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", None)
        for pg in self._pgs.values():
            if pg is not None and pg is not non_member and id(pg) not in done:
                dist.destroy_process_group(pg)
                done.add(id(pg))
        self._pgs.clear()

    def is_current_rank_in_grid(self) -> bool:
        """Whether this rank is in [rank_offset, rank_offset + size)."""
        return self.rank_offset <= dist.get_rank() < self.rank_offset + self.size

    # ------------------------------------------------------------------ enumeration
    def _gen_rank_enum(self, dims: list[str]) -> list[list[int]]:
        """Groups over `dims` in the base view (see `_enum_for`)."""
        return self._enum_for(self.shape, self.dim_names, dims)

    def _enum_for(self, shape: list[int], dim_names: list[str], dims: list[str]) -> list[list[int]]:
        """Groups over `dims` (the last of `dims` varies fastest inside a group), e.g. shape
        [2, 2, 2], names a b c: dims [a, b] -> [[0, 2, 1, 3], [4, 6, 5, 7]]; create_pg passes
        `dims` sorted by `_ordered` ([b, a] -> [[0, 1, 2, 3], [4, 5, 6, 7]])."""
        reverse = dim_names[::-1]  # numpy's C order: the slowest axis first
        remaining = [d for d in reverse if d not in dims]
        sizes = dict(zip(dim_names, shape))
        grid = np.arange(self.rank_offset, self.rank_offset + math.prod(shape)).reshape(
            [sizes[d] for d in reverse]
        )
        grid = grid.transpose([reverse.index(d) for d in remaining + list(dims)])
        group_size = math.prod(sizes[d] for d in dims)
        return grid.reshape(-1, group_size).tolist()

    def _gen_rank_enum_for(
        self, shape: list[int], dim_names: list[str], dims: list[str]
    ) -> list[list[int]]:
        """Megatron's name for `_enum_for` (groups over `dims` of an explicit shape)."""
        return self._enum_for(shape, dim_names, dims)

    def _order_dims_for(self, dim_names: list[str], dims: str | list[str]) -> tuple[list[str], str]:
        """(`dims` sorted by reversed `dim_names`, their group key "a-b"); a str stays as given.

        E.g. dim_names [tp, cp, dp], dims [tp, dp] -> ([dp, tp], "dp-tp")."""
        if not isinstance(dims, list):
            ordered = [dims]
        else:
            reverse = dim_names[::-1]
            ordered = [reverse[i] for i in sorted(reverse.index(d) for d in dims)]
        return ordered, "-".join(ordered)

    def _view(self, view: str | None) -> _RankViewSpec:
        name = _BASE_VIEW_NAME if view is None else view
        if name not in self._views:
            raise KeyError(
                f"View {name!r} is not registered. Registered views: {sorted(self._views)}"
            )
        return self._views[name]

    @staticmethod
    def _ordered(spec: _RankViewSpec, dims: str | list[str]) -> list[str]:
        """`dims` sorted by the view's reversed `dim_names` (a single str stays as given)."""
        requested = [dims] if not isinstance(dims, list) else dims
        missing = [d for d in requested if d not in spec.dim_names]
        if missing:
            raise ValueError(
                f"{missing[0]!r} is not in view {spec.name!r} with dim_names {spec.dim_names}"
            )
        reverse = spec.dim_names[::-1]
        return [reverse[i] for i in sorted(reverse.index(d) for d in requested)]

    def _key(self, dims: str | list[str], view: str | None):
        """(storage key, view to enumerate in, its ordered dims) for a group request: groups
        over a view's shared dims only are the base view's."""
        spec = self._view(view)
        ordered = self._ordered(spec, dims)
        if spec.name == _BASE_VIEW_NAME:
            return "-".join(ordered), spec, ordered
        if all(d in spec.shared_dims for d in ordered):
            base = self._views[_BASE_VIEW_NAME]
            base_ordered = self._ordered(base, ordered)
            return "-".join(base_ordered), base, base_ordered
        return (spec.name, tuple(ordered)), spec, ordered
