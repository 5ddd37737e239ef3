"""Who saves or loads which shard inside a parallelization group, and the exchange after a
load; mirrors `megatron.core.dist_checkpointing.exchange_utils`.

Every rank gathers the group's shard list (ids, sizes, which copies are main replicas) and runs
the same deterministic greedy assignment, so no further communication is needed to agree:
shards are taken by (1) main replica inside the group before cross-group ones, (2) fewest
ranks holding them, (3) largest first, (4) shard id; each goes to the least loaded rank that
holds it (ties: lowest rank). After a load each shard is broadcast from the rank that read it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypeVar

import torch
import torch.distributed as dist

from gigatron.core.dist_checkpointing.dict_utils import nested_values
from gigatron.core.dist_checkpointing.mapping import ShardedTensor, is_main_replica
from gigatron.core.dist_checkpointing.utils import _sharded_tensor_shard_id, _ShardId

T = TypeVar("T")


def _exchange_device() -> torch.device:
    """CUDA when present (NCCL exchanges), else the CPU (gloo), as Megatron exchanges."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


EXCHANGE_ALGOS = ("broadcast", "gather_object", "gather_rounds")


class ShardDistribution(NamedTuple):
    """One group's assignment: `main_rank_for_shard` (group rank doing a shard's I/O),
    `shards_in_this_group` (shards whose main replica is in the group), `shard_to_metadata`
    (a data-less ShardedTensor per shard), `all_ranks_for_shard` (group ranks holding it)."""

    main_rank_for_shard: dict
    shards_in_this_group: set
    shard_to_metadata: dict
    all_ranks_for_shard: dict


def _shard_size(sh_ten: ShardedTensor) -> int:
    """Bytes of the shard's box (`local_shape`), as Megatron sizes it."""
    return math.prod(sh_ten.local_shape) * torch.empty((), dtype=sh_ten.dtype).element_size()


def _order_key(shard_id: Any) -> tuple:
    # None (no flat range) sorts before any range, so mixed ids still compare.
    if isinstance(shard_id, tuple):
        return tuple((0, ()) if p is None else (1, p) for p in shard_id)
    return (shard_id,)


def distribute_shards_to_ranks(
    shard_to_ranks: dict[T, list[int]],
    shard_to_size: dict[T, int],
    num_ranks: int,
    cross_parallelization_group_loads: set[T] = frozenset(),
) -> dict[T, int]:
    """{shard: rank doing its work}: greedy by (cross-group last, coverage, -size, id), each to
    the least loaded rank among those holding it."""
    load = [0] * num_ranks
    order = sorted(
        shard_to_ranks,
        key=lambda s: (
            s in cross_parallelization_group_loads,
            len(shard_to_ranks[s]),
            -shard_to_size[s],
            _order_key(s),
        ),
    )
    out = {}
    for shard in order:
        ranks = shard_to_ranks[shard]
        if not ranks:
            raise ValueError(f"shard {shard!r} is held by no rank of the group")
        rank = min(ranks, key=lambda r: (load[r], r))
        out[shard] = rank
        load[rank] += shard_to_size[shard]
    return out


def determine_main_replica_uniform_distribution(
    sharded_state_dict,
    parallelization_group,
    ignore_groups: bool = False,
    pg_cache_path: str | None = None,
    pg_cache_create: bool = False,
) -> ShardDistribution | None:
    """Collective over `parallelization_group`: the shard assignment for its ranks, or None for
    a group of one. Saves: only shards whose main replica is in this group
    (`shards_in_this_group`). `ignore_groups` (loads): every shard any rank holds, the ones
    whose main replica is in another group assigned last. `pg_cache_path` (Megatron's
    distribution cache file) must stay None."""
    if pg_cache_path is not None or pg_cache_create:
        raise ValueError(
            f"pg_cache_path ({pg_cache_path!r}) / pg_cache_create ({pg_cache_create!r}): gigatron "
            "computes the distribution on each call and has no cache file"
        )
    group_size = dist.get_world_size(parallelization_group)
    if group_size <= 1:
        return None
    local = {}
    for sh_ten in nested_values(sharded_state_dict):
        if isinstance(sh_ten, ShardedTensor):
            shard_id = _sharded_tensor_shard_id(sh_ten)
            main = is_main_replica(sh_ten.replica_id)
            prev = local.get(shard_id)
            local[shard_id] = (_shard_size(sh_ten), main or (prev is not None and prev[1]),
                               sh_ten.without_data())  # fmt: skip
    gathered: list = [None] * group_size
    dist.all_gather_object(gathered, local, group=parallelization_group)

    shard_to_ranks: dict = {}
    shard_to_size: dict = {}
    shard_to_metadata: dict = {}
    in_group = set()
    for rank, shards in enumerate(gathered):
        for shard_id, (size, main, meta) in shards.items():
            shard_to_ranks.setdefault(shard_id, []).append(rank)
            shard_to_size[shard_id] = size
            shard_to_metadata.setdefault(shard_id, meta)
            if main:
                in_group.add(shard_id)
    shards = set(shard_to_ranks) if ignore_groups else in_group
    cross = shards - in_group
    shard_to_ranks = {s: r for s, r in shard_to_ranks.items() if s in shards}
    main_rank_for_shard = distribute_shards_to_ranks(
        shard_to_ranks, shard_to_size, group_size, cross
    )
    return ShardDistribution(main_rank_for_shard, shards, shard_to_metadata, shard_to_ranks)


def _get_empty_tensor_for_exchange(
    shard_id: _ShardId,
    needed_shards: dict,
    unneeded_shards: dict,
    loaded_tensors: dict,
) -> tuple[torch.Tensor, torch.device | None]:
    """A tensor to receive `shard_id` into, on the exchange device (CUDA if present, else the
    CPU), and the device of this rank's own tensor for it (None when this rank does not need
    the shard: the tensor is then a scratch buffer). A needed shard's tensor is also recorded
    in `loaded_tensors`."""
    device = _exchange_device()
    needed = needed_shards.get(shard_id)
    if needed is None:
        sh_ten = unneeded_shards[shard_id]
        if sh_ten.data is None:
            sh_ten.init_data(device)
            tensor, sh_ten.data = sh_ten.data, None
        else:
            tensor = sh_ten.data
            if tensor.device != device:
                tensor = torch.empty_like(tensor, device=device)
        return tensor, None
    if needed.data is None:
        needed.init_data(device)
    orig_device = needed.data.device
    tensor = needed.data
    if tensor.device != device:
        tensor = torch.empty_like(tensor, device=device)
    loaded_tensors[shard_id] = tensor
    return tensor, orig_device


def exchange_by_distribution(
    loaded_tensors: dict,
    unloaded_shards: dict,
    shard_distribution: ShardDistribution,
    parallelization_group=None,
    exchange_algo: str = "broadcast",
) -> dict:
    """Collective: give every rank the shards in `unloaded_shards` (by id) from the rank that
    loaded them (`main_rank_for_shard`); returns `loaded_tensors` completed. Each shard is
    broadcast over the group in id order; gigatron runs this for every `exchange_algo`
    (Megatron's gather variants move the same bytes with other collectives)."""
    if exchange_algo not in EXCHANGE_ALGOS:
        raise NotImplementedError(
            f"exchange_algo {exchange_algo!r}: expected one of {', '.join(EXCHANGE_ALGOS)}"
        )
    group = parallelization_group or dist.group.WORLD
    my_rank = dist.get_rank(group)
    unneeded = {}
    for shard_id in sorted(shard_distribution.main_rank_for_shard, key=_order_key):
        src = shard_distribution.main_rank_for_shard[shard_id]
        if src == my_rank:
            tensor, orig_device = loaded_tensors[shard_id], None
            assert shard_id not in unloaded_shards
        else:
            if shard_id not in unloaded_shards:
                unneeded[shard_id] = shard_distribution.shard_to_metadata[shard_id]
            tensor, orig_device = _get_empty_tensor_for_exchange(
                shard_id, unloaded_shards, unneeded, loaded_tensors
            )
        dist.broadcast(tensor, src=dist.get_global_rank(group, src), group=group)
        if orig_device is not None and tensor.device != orig_device:
            loaded_tensors[shard_id] = tensor.to(orig_device)
    return loaded_tensors
