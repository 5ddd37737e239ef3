"""Megatron 0.20's dist_checkpointing helpers on gigatron: the torch_dist strategy objects with
save / load, remove_sharded_tensors, dict_utils.diff, the extract_* splitters, zip_strict and
determine_global_metadata(process_group=). One process, no process group."""

from __future__ import annotations

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing import dict_utils
from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedObject,
    ShardedTensor,
    apply_factories,
)
from gigatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import (
    CachedMetadataFileSystemReader,
)
from gigatron.core.dist_checkpointing.strategies.torch import (
    TorchDistLoadShardedStrategy,
    TorchDistSaveShardedStrategy,
)
from gigatron.core.dist_checkpointing.utils import (
    extract_nonpersistent,
    extract_sharded_base,
    extract_sharded_tensors,
    extract_sharded_tensors_and_factories,
    zip_strict,
)
from gigatron.core.dist_checkpointing.validation import (
    determine_global_metadata,
    validate_sharding_integrity,
)


def _sd(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {
        "sd_a": ShardedTensor.from_rank_offsets("a", a),
        "nested": {"sd_prefix_b": ShardedTensor.from_rank_offsets("prefix_b", b)},
        "obj": ShardedObject("obj", {"step": 3}, (1,), (0,)),
        "plain": 7,
    }


def test_strategies_save_load_and_remove(tmp_path):
    a, b = torch.arange(12.0).view(3, 4), torch.randn(2, 5)
    save_strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=2)
    dc.save(_sd(a, b), str(tmp_path), save_strategy)
    loaded = dc.load(_sd(torch.zeros(3, 4), torch.zeros(2, 5)), str(tmp_path),
                     sharded_strategy=TorchDistLoadShardedStrategy())  # fmt: skip
    torch.testing.assert_close(loaded["sd_a"], a, rtol=0, atol=0)
    torch.testing.assert_close(loaded["nested"]["sd_prefix_b"], b, rtol=0, atol=0)
    assert loaded["obj"] == {"step": 3} and loaded["plain"] == 7

    # the strategy's own load: only the sharded leaves, in the request's nesting
    direct = TorchDistLoadShardedStrategy().load(
        _sd(torch.zeros(3, 4), torch.zeros(2, 5)), tmp_path
    )
    assert set(direct) == {"sd_a", "nested", "obj"} and direct["obj"] == {"step": 3}
    meta = TorchDistLoadShardedStrategy().load_sharded_metadata(tmp_path)
    cached = CachedMetadataFileSystemReader(tmp_path).read_metadata()
    assert CachedMetadataFileSystemReader(str(tmp_path)).read_metadata() is cached
    assert (
        CachedMetadataFileSystemReader(tmp_path, cache_metadata=False).read_metadata() is not cached
    )
    CachedMetadataFileSystemReader.clear_metadata_cache()
    assert meta["a"].global_shape == (3, 4) and "obj/shard_0_1" in meta

    dc.remove_sharded_tensors(str(tmp_path), key_prefix="prefix")
    assert set(dc.load_tensors_metadata(str(tmp_path))) == {"a"}
    again = dc.load(
        {"sd_a": ShardedTensor.from_rank_offsets("a", torch.zeros(3, 4))}, str(tmp_path)
    )
    torch.testing.assert_close(again["sd_a"], a, rtol=0, atol=0)
    with pytest.raises(dc.CheckpointingException, match="prefix_b"):
        dc.load(
            {"b": ShardedTensor.from_rank_offsets("prefix_b", torch.zeros(2, 5))}, str(tmp_path)
        )
    with pytest.warns(UserWarning, match="nothing removed"):
        dc.remove_sharded_tensors(str(tmp_path), key_prefix="prefix")

    # a strategy-only save (no common state): the same tensors, readable by the load strategy
    sub = tmp_path / "strategy_only"
    sub.mkdir()
    TorchDistSaveShardedStrategy().save(_sd(a, b), sub)
    out = TorchDistLoadShardedStrategy().load(
        {"x": ShardedTensor.from_rank_offsets("a", torch.zeros(3, 4))}, sub
    )
    torch.testing.assert_close(out["x"], a, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"separation_hint": "p"},
        {"cached_metadata": True},
        {"keep_only_main_replica": False},
        {"backend": "zarr"},
    ],  # fmt: skip
)
def test_save_strategy_refuses_what_gigatron_lacks(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs)) if "backend" not in kwargs else "zarr"):
        TorchDistSaveShardedStrategy(**kwargs)


def test_diff_extract_zip_and_global_metadata():
    left = {"a": torch.ones(2), "b": [1, 2, 3], "c": {"x": 1}, "only_l": 0}
    right = {"a": torch.tensor([1.0, 0.0]), "b": [1, 2], "c": {"x": 1}, "only_r": 0}
    only_left, only_right, mismatch = dict_utils.diff(left, right)
    assert only_left == [("only_l",), 2] and only_right == [("only_r",)]
    assert [m[0] for m in mismatch] == [("a",)] and mismatch[0][3] == 1  # one differing element
    assert dict_utils.diff(left, left) == ([], [], [])
    nested = {"a": [1, {"b": 2}]}
    assert dict_utils.dict_list_map_outplace(lambda v: v * 10, nested) == {"a": [10, {"b": 20}]}
    assert nested == {"a": [1, {"b": 2}]}

    st = ShardedTensor.from_rank_offsets("k", torch.zeros(2))
    sd = {"t": st, "o": ShardedObject("o", 1, (1,), (0,)), "n": LocalNonpersistentObject(5),
          "p": 1, "l": [st, 2]}  # fmt: skip
    tensors, rest = extract_sharded_tensors(sd)
    assert tensors == {"t": st, "l": [st]} and rest["p"] == 1 and "o" in rest and "n" in rest
    base, rest = extract_sharded_base(sd)
    assert set(base) == {"t", "o", "l"} and set(rest) == {"n", "p", "l"}
    nonpersistent, rest = extract_nonpersistent(sd)
    assert set(nonpersistent) == {"n"} and "n" not in rest
    assert extract_sharded_tensors_and_factories(sd)[0] == tensors
    apply_factories(sd)  # no factories: unchanged
    assert sd["t"] is st

    assert list(zip_strict([1, 2], "ab")) == [(1, "a"), (2, "b")]
    with pytest.raises(AssertionError, match=r"\[2, 1\]"):
        zip_strict([1, 2], [1])

    local, global_md = determine_global_metadata({"t": st}, process_group=None)
    assert local[0].data is None and local[0].key == "k" and len(global_md) == 1
    validate_sharding_integrity(global_md)
    doubled = [[st.without_data(), st.without_data()]]  # the same box written twice
    with pytest.raises(dc.CheckpointingException, match="both write"):
        validate_sharding_integrity(doubled)
