"""Fully parallel save / load (`strategies.fully_parallel`, `exchange_utils`).

- the greedy assignment: coverage, then size, then shard id; least loaded holder wins;
- on 2 gloo ranks (DP = 2, every tensor replicated): a checkpoint saved fully-parallel holds the
  same tensors as one saved plainly, each rank writes about half the bytes (not rank 0 all),
  and a fully-parallel load (each shard read once, then broadcast) gives the same tensors as a
  plain load, also into a TP-sharded request.
"""

import os

import pytest
import torch

from gigatron.core.dist_checkpointing.exchange_utils import distribute_shards_to_ranks
from gigatron.core.dist_checkpointing.utils import _sharded_object_id, _sharded_tensor_shard_id
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def test_distribution_prefers_low_coverage_then_size_then_id():
    shard_to_ranks = {"only0": [0], "big": [0, 1, 2], "small": [0, 1, 2], "mid_a": [1, 2]}
    sizes = {"only0": 5, "big": 100, "small": 1, "mid_a": 10}
    out = distribute_shards_to_ranks(shard_to_ranks, sizes, 3)
    # only0 -> 0 (coverage 1); mid_a -> 1 (coverage 2, least loaded of 1,2); big -> 2;
    # small -> 0 (loads 5, 10, 100).
    assert out == {"only0": 0, "mid_a": 1, "big": 2, "small": 0}
    # Shards whose main replica is in another group go last, whatever their coverage.
    out = distribute_shards_to_ranks(shard_to_ranks, sizes, 3, {"only0"})
    assert out["mid_a"] == 1 and out["only0"] == 0


def test_shard_ids_name_key_offset_and_range():
    from gigatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    t = ShardedTensor.from_rank_offsets("w", torch.zeros(2, 4), (0, 1, 2))
    assert _sharded_tensor_shard_id(t) == ("w", (2, 0), None)
    flat = ShardedTensor.from_rank_offsets_flat(
        "w", torch.zeros(3), (2, 4), (0, 1, 2), flattened_range=slice(1, 4)
    )
    assert _sharded_tensor_shard_id(flat) == ("w", (2, 0), (1, 4))
    obj = ShardedObject("o", 1, (2,), (1,))
    assert _sharded_object_id(obj) == ("o", (1,), (2,))


def _state_dict(rank_value: float):
    from gigatron.core.dist_checkpointing import ShardedTensor

    g = torch.Generator().manual_seed(0)
    # Every rank holds the same full tensors (DP replicas): replica_id = DP rank.
    import torch.distributed as dist

    dp_rank = dist.get_rank()
    return {
        name: ShardedTensor.from_rank_offsets(
            name, torch.randn(*shape, generator=g) + rank_value * 0, replica_id=dp_rank
        )
        for name, shape in (("a", (64, 8)), ("b", (32, 8)), ("c", (16, 8)), ("d", (16,)))
    }


def _bytes_written(ckpt_dir: str, rank: int) -> int:
    return sum(
        os.path.getsize(os.path.join(ckpt_dir, f))
        for f in os.listdir(ckpt_dir)
        if f.startswith(f"__{rank}_") and f.endswith(".distcp")
    )


def _save_and_load_both_ways(root: str):
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing as dc
    from gigatron.core.dist_checkpointing import ShardedTensor
    from gigatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper,
        FullyParallelSaveStrategyWrapper,
    )
    from gigatron.core.dist_checkpointing.strategies.torch import (
        TorchDistLoadShardedStrategy,
        TorchDistSaveShardedStrategy,
    )

    rank = dist.get_rank()
    plain, parallel = os.path.join(root, "plain"), os.path.join(root, "parallel")
    if rank == 0:
        os.makedirs(plain), os.makedirs(parallel)
    dist.barrier()
    dc.save(_state_dict(0), plain, TorchDistSaveShardedStrategy())
    wrapper = FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy(), do_cache_distribution=True
    )
    dc.save(_state_dict(0), parallel, wrapper)
    savers = dict(wrapper.cached_distribution.main_rank_for_shard)
    written = (
        [_bytes_written(plain, r) for r in (0, 1)],
        [_bytes_written(parallel, r) for r in (0, 1)],
    )

    def request():
        return {k: ShardedTensor.from_rank_offsets(k, torch.zeros_like(v.data), replica_id=rank)
                for k, v in _state_dict(0).items()}  # fmt: skip

    from_plain = dc.load(request(), plain, TorchDistLoadShardedStrategy())
    from_parallel = dc.load(
        request(), parallel, FullyParallelLoadStrategyWrapper(TorchDistLoadShardedStrategy())
    )
    # A TP-like request: rank r asks for row half r of "a" (no shard is needed by both ranks).
    half = {"a": ShardedTensor.from_rank_offsets("a", torch.zeros(32, 8), (0, rank, 2))}
    half = dc.load(half, parallel, FullyParallelLoadStrategyWrapper(TorchDistLoadShardedStrategy()))
    expected = {k: v.data for k, v in _state_dict(0).items()}
    return savers, written, from_plain, from_parallel, half["a"], expected


def test_fully_parallel_save_and_load_equal_plain_ones_at_dp2(tmp_path):
    results = run_distributed(_save_and_load_both_ways, 2, args=(str(tmp_path),), timeout=120)
    for rank, (savers, written, from_plain, from_parallel, half, expected) in enumerate(results):
        plain_bytes, parallel_bytes = written
        assert plain_bytes[1] == 0  # plain: the main replicas all live on rank 0
        assert min(parallel_bytes) > 0  # fully parallel: both ranks write
        assert set(savers.values()) == {0, 1}
        for key, tensor in expected.items():
            torch.testing.assert_close(from_plain[key], tensor, rtol=0, atol=0)
            torch.testing.assert_close(from_parallel[key], tensor, rtol=0, atol=0)
        torch.testing.assert_close(half, expected["a"][32 * rank : 32 * (rank + 1)], rtol=0, atol=0)
