"""Spread checkpoint I/O over a parallelization group (usually data-parallel); mirrors
`megatron.core.dist_checkpointing.strategies.fully_parallel`.

Save: replicas of a shard (e.g. the same weights on every DP rank) would all be written by the
rank holding the main replica. The wrapper reassigns, per shard, which copy is the main one
(`exchange_utils.determine_main_replica_uniform_distribution`), so each shard is still written
exactly once but the bytes are balanced over the group. Load: each shard any rank of the group
needs is read by one rank and then broadcast to the others that need it.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from gigatron.core.dist_checkpointing.dict_utils import nested_items_with_path, set_at_path
from gigatron.core.dist_checkpointing.exchange_utils import (
    EXCHANGE_ALGOS,
    ShardDistribution,
    determine_main_replica_uniform_distribution,
    exchange_by_distribution,
)
from gigatron.core.dist_checkpointing.mapping import ShardedTensor
from gigatron.core.dist_checkpointing.utils import _sharded_tensor_shard_id


def _refuse_cache(pg_cache_path, pg_cache_create) -> None:
    if pg_cache_path is not None or pg_cache_create:
        raise ValueError(
            f"pg_cache_path ({pg_cache_path!r}) / pg_cache_create ({pg_cache_create!r}): "
            "gigatron computes the shard distribution on each call (no cache file)"
        )


class FullyParallelSaveStrategyWrapper:
    """Wraps a save strategy: before saving, the main replica of each shard whose main replica
    is in `parallelization_group` (default: the world) moves to the group rank chosen by the
    uniform distribution (`replica_id` 0 there, 1 on the other holders)."""

    def __init__(
        self,
        strategy,
        parallelization_group=None,
        do_cache_distribution: bool = False,
        backend: str = "torch_dist",
        version: int = 1,
        validate_access_integrity: bool = True,
        pg_cache_path: str | None = None,
        pg_cache_create: bool = False,
    ):
        _refuse_cache(pg_cache_path, pg_cache_create)
        self.base_strategy = strategy
        self.backend, self.version = backend, version
        self.parallelization_group = parallelization_group or dist.group.WORLD
        self.do_cache_distribution = do_cache_distribution
        self.validate_access_integrity = validate_access_integrity
        self.cached_distribution: ShardDistribution | None = None

    def can_handle_sharded_objects(self) -> bool:
        return self.base_strategy.can_handle_sharded_objects()

    def save(self, sharded_state_dict, checkpoint_dir: str | Path):
        self.apply_saving_parallelization(sharded_state_dict)
        return self.base_strategy.save(sharded_state_dict, checkpoint_dir)

    def async_save(self, sharded_state_dict, checkpoint_dir: str | Path):
        if not hasattr(self.base_strategy, "async_save"):
            raise TypeError(f"{type(self.base_strategy).__name__} has no async_save")
        self.apply_saving_parallelization(sharded_state_dict)
        return self.base_strategy.async_save(sharded_state_dict, checkpoint_dir)

    def apply_saving_parallelization(self, sharded_state_dict) -> None:
        """Collective over the group: set `replica_id` of this rank's ShardedTensors in place."""
        distribution = self.cached_distribution
        if distribution is None or not self.do_cache_distribution:
            distribution = determine_main_replica_uniform_distribution(
                sharded_state_dict, self.parallelization_group
            )
            if self.do_cache_distribution:
                self.cached_distribution = distribution
        if distribution is None:
            return  # a group of one: nothing to spread
        my_rank = dist.get_rank(self.parallelization_group)
        for _, sh_ten in nested_items_with_path(sharded_state_dict):
            if not isinstance(sh_ten, ShardedTensor):
                continue
            shard_id = _sharded_tensor_shard_id(sh_ten)
            if shard_id in distribution.shards_in_this_group:
                sh_ten.replica_id = int(distribution.main_rank_for_shard[shard_id] != my_rank)


class FullyParallelLoadStrategyWrapper:
    """Wraps a load strategy: of the ShardedTensors the ranks of `parallelization_group`
    request, each shard is read by one rank (the uniform distribution over the ranks that
    request it) and broadcast to the others; ShardedObjects and the rest load through the
    wrapped strategy on every rank."""

    def __init__(
        self,
        strategy,
        parallelization_group=None,
        do_cache_distribution: bool = False,
        exchange_algo: str = "broadcast",
        per_rank_object_load: bool = False,
        pg_cache_path: str | None = None,
        pg_cache_create: bool = False,
    ):
        _refuse_cache(pg_cache_path, pg_cache_create)
        if exchange_algo not in EXCHANGE_ALGOS:
            raise NotImplementedError(
                f"exchange_algo {exchange_algo!r}: expected one of {', '.join(EXCHANGE_ALGOS)}"
            )
        self.base_strategy = strategy
        self.backend = getattr(strategy, "backend", "torch_dist")
        self.version = getattr(strategy, "version", 1)
        self.parallelization_group = parallelization_group or dist.group.WORLD
        self.do_cache_distribution = do_cache_distribution
        self.exchange_algo = exchange_algo
        self.per_rank_object_load = per_rank_object_load
        self.cached_distribution: ShardDistribution | None = None

    def can_handle_sharded_objects(self) -> bool:
        return self.base_strategy.can_handle_sharded_objects()

    def check_backend_compatibility(self, loaded_backend) -> None:
        return self.base_strategy.check_backend_compatibility(loaded_backend)

    def check_version_compatibility(self, loaded_version) -> None:
        return self.base_strategy.check_version_compatibility(loaded_version)

    def load_tensors_metadata(self, checkpoint_dir: str | Path):
        return self.base_strategy.load_tensors_metadata(checkpoint_dir)

    def load_sharded_metadata(self, checkpoint_dir: str | Path):
        return self.base_strategy.load_sharded_metadata(checkpoint_dir)

    def _distribution(self, sharded_state_dict) -> ShardDistribution | None:
        if self.do_cache_distribution and self.cached_distribution is not None:
            return self.cached_distribution
        distribution = determine_main_replica_uniform_distribution(
            sharded_state_dict, self.parallelization_group, ignore_groups=True
        )
        if self.do_cache_distribution:
            self.cached_distribution = distribution
        return distribution

    def apply_loading_parallelization(self, sharded_state_dict) -> ShardDistribution | None:
        """Collective: the distribution `load` uses (which group rank reads each shard)."""
        return self._distribution(sharded_state_dict)

    def load(self, sharded_state_dict, checkpoint_dir: str | Path):
        """Collective over the group: the request's structure with every ShardedTensor's data
        (as the wrapped strategy returns it), read once per shard in the group."""
        distribution = self.apply_loading_parallelization(sharded_state_dict)
        if distribution is None:
            return self.base_strategy.load(sharded_state_dict, checkpoint_dir)
        my_rank = dist.get_rank(self.parallelization_group)
        to_load, deferred = {}, []  # path -> leaf read here; (path, shard id) filled later
        unloaded: dict = {}
        read_here: dict = {}  # shard id -> path of the copy this rank reads
        for path, leaf in nested_items_with_path(sharded_state_dict):
            if not isinstance(leaf, ShardedTensor):
                to_load[path] = leaf
                continue
            shard_id = _sharded_tensor_shard_id(leaf)
            if distribution.main_rank_for_shard[shard_id] == my_rank and shard_id not in read_here:
                read_here[shard_id] = path
                to_load[path] = leaf
            else:
                deferred.append((path, shard_id))
                if distribution.main_rank_for_shard[shard_id] != my_rank:
                    unloaded.setdefault(shard_id, leaf)
        request: dict = {}
        for path, leaf in to_load.items():
            set_at_path(request, path, leaf)
        loaded = self.base_strategy.load(request, checkpoint_dir)
        loaded_tensors = {sid: _at_path(loaded, path) for sid, path in read_here.items()}
        loaded_tensors = exchange_by_distribution(
            loaded_tensors, unloaded, distribution, self.parallelization_group, self.exchange_algo
        )
        for path, shard_id in deferred:
            set_at_path(loaded, path, loaded_tensors[shard_id])
        return loaded


def _at_path(root, path: tuple):
    for part in path:
        root = root[part]
    return root
