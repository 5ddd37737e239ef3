"""Save at one layout, load at others on gloo ranks: every full tensor bitwise equal.

Layouts: rows / columns / 2D grid / replicated, stacked-layer axis (prepend_axis_num), and
distributed-optimizer style flat ranges of the flattened local shard, saved and loaded in any
combination, plus the validation errors a bad sharding gets.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException as DCPCheckpointException

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing import ShardedObject, ShardedTensor
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


SHAPE = (12, 8)
LAYERS = 4


def _full(key: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, key)))
    if key == "stack":
        return torch.randn(LAYERS, *SHAPE, generator=g)
    return torch.randn(SHAPE, generator=g)


def _flat_ranges(numel: int, parts: int) -> list[slice]:
    """Uneven contiguous ranges, like the distributed optimizer's buckets cut parameters."""
    cuts = sorted({0, numel, *[(numel * (2 * i + 1)) // (2 * parts + 1) for i in range(parts)]})
    cuts = cuts[:parts] + [numel] if len(cuts) > parts + 1 else cuts
    while len(cuts) < parts + 1:
        cuts.insert(-1, cuts[-2])
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]


def _sharded(layout: str, rank: int, world: int, zeros: bool = False):
    """This rank's sharded state dict for `layout`; data from the full tensors (or zeros)."""
    fill = (lambda t: torch.zeros_like(t)) if zeros else (lambda t: t.clone())
    w, x, stack = _full("w"), _full("x"), _full("stack")
    if layout == "rows":  # TP column-parallel style
        sd = {
            "w": ShardedTensor.from_rank_offsets(
                "w", fill(w.chunk(world, 0)[rank]), (0, rank, world)
            )
        }
    elif layout == "cols":  # TP row-parallel style
        sd = {
            "w": ShardedTensor.from_rank_offsets(
                "w", fill(w.chunk(world, 1)[rank]), (1, rank, world)
            )
        }
    elif layout == "grid":  # 2 x (world/2) grid
        a, b = 2, world // 2
        i, j = rank // b, rank % b
        piece = w.chunk(a, 0)[i].chunk(b, 1)[j]
        sd = {"w": ShardedTensor.from_rank_offsets("w", fill(piece), (0, i, a), (1, j, b))}
    elif layout == "replicated":
        sd = {"w": ShardedTensor.from_rank_offsets("w", fill(w), replica_id=rank)}
    elif layout == "flat":  # distributed-optimizer shard of the (rows-split, dp=1) parameter
        rng = _flat_ranges(w.numel(), world)[rank]
        sd = {"w": ShardedTensor.from_rank_offsets_flat(
            "w", fill(w.flatten()[rng]), SHAPE, flattened_range=rng)}  # fmt: skip
    elif layout == "flat_tp2":  # TP2 rows x DP(world/2) flat ranges inside each TP shard
        tp, dp = 2, world // 2
        tp_rank, dp_rank = rank % tp, rank // tp
        local = w.chunk(tp, 0)[tp_rank]
        rng = _flat_ranges(local.numel(), dp)[dp_rank]
        sd = {"w": ShardedTensor.from_rank_offsets_flat(
            "w", fill(local.flatten()[rng]), tuple(local.shape), (0, tp_rank, tp),
            flattened_range=rng)}  # fmt: skip
    else:
        raise ValueError(layout)
    # x: always replicated differently from w (DP-style: rank r holds a copy, replica r)
    sd["x"] = ShardedTensor.from_rank_offsets("x", fill(x), replica_id=rank)
    # stack: layers split over "pipeline stages" (prepended axis), columns over the rest
    per_stage = LAYERS // world if LAYERS % world == 0 else LAYERS
    owned = range(rank * per_stage, (rank + 1) * per_stage) if per_stage < LAYERS else range(LAYERS)
    sd["layers"] = [
        ShardedTensor.from_rank_offsets(
            "stack", fill(stack[i]), (0, i, LAYERS),
            replica_id=0 if per_stage < LAYERS or rank == 0 else rank, prepend_axis_num=1)
        for i in owned
    ]  # fmt: skip
    return sd


def _expected(layout, rank, world):
    return _sharded(layout, rank, world)


def _save_then_load(ckpt_dir, save_layout, load_layouts):
    rank, world = dist.get_rank(), dist.get_world_size()
    dc.save(_sharded(save_layout, rank, world), ckpt_dir)
    for layout in load_layouts:
        loaded = dc.load(_sharded(layout, rank, world, zeros=True), ckpt_dir)
        expected = _expected(layout, rank, world)
        assert torch.equal(loaded["w"], expected["w"].data), (save_layout, layout)
        assert torch.equal(loaded["x"], expected["x"].data)
        for got, want in zip(loaded["layers"], expected["layers"]):
            assert torch.equal(got, want.data)
    return True


LAYOUTS = ["rows", "cols", "grid", "replicated", "flat", "flat_tp2"]


@pytest.mark.parametrize("save_layout", ["flat_tp2", "grid"])
def test_save_once_load_every_layout_4_ranks(tmp_path, save_layout):
    run_distributed(_save_then_load, 4, args=(str(tmp_path), save_layout, LAYOUTS))


def _save_at(ckpt_dir, layout):
    dc.save(_sharded(layout, dist.get_rank(), dist.get_world_size()), ckpt_dir)


def _load_only(ckpt_dir, layouts):
    rank, world = dist.get_rank(), dist.get_world_size()
    for layout in layouts:
        loaded = dc.load(_sharded(layout, rank, world, zeros=True), ckpt_dir)
        assert torch.equal(loaded["w"], _expected(layout, rank, world)["w"].data), layout
    return True


def test_change_world_size_4_to_2_and_1(tmp_path):
    """Saved by 4 ranks as flat optimizer shards; read by 2 ranks and by 1 rank."""
    run_distributed(_save_at, 4, args=(str(tmp_path), "flat_tp2"))
    run_distributed(_load_only, 2, args=(str(tmp_path), ["rows", "cols", "flat", "flat_tp2"]))
    full = dc.load_plain_tensors(str(tmp_path))
    assert torch.equal(full["w"], _full("w")) and torch.equal(full["stack"], _full("stack"))
    meta = dc.load_tensors_metadata(str(tmp_path))
    assert meta["stack"].global_shape == (LAYERS, *SHAPE) and meta["w"].dtype == torch.float32


def _bad_shardings(ckpt_dir):
    rank, world = dist.get_rank(), dist.get_world_size()
    w = _full("w")
    cases = {
        # every rank claims to be the main replica
        "both write": {"w": ShardedTensor.from_rank_offsets("w", w.clone())},
        # rank 1's rows are nobody's main replica
        "cover": {"w": ShardedTensor.from_rank_offsets(
            "w", w.chunk(world, 0)[rank].clone(), (0, rank, world), replica_id=int(rank == 1))},
        "exactly one main replica": {"o": ShardedObject("o", rank, (1,), (0,))},
    }  # fmt: skip
    msgs = {}
    for needle, sd in cases.items():
        with pytest.raises(dc.CheckpointingException) as info:
            dc.save(sd, ckpt_dir)
        msgs[needle] = str(info.value)
    return msgs


def test_bad_sharding_is_rejected_on_every_rank(tmp_path):
    for msgs in run_distributed(_bad_shardings, 2, args=(str(tmp_path),)):
        assert all(needle in msg for needle, msg in msgs.items()), msgs


def _objects_and_strict(ckpt_dir):
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = {"rank": rank, "state": torch.arange(3) + rank}
    piece = _full("w").chunk(world, 0)[rank].clone()
    sd = {
        "rng": ShardedObject("rng", rng, (world,), (rank,)),
        "w": ShardedTensor.from_rank_offsets("w", piece, (0, rank, world)),
        "iteration": 7,
    }
    dc.save(sd, ckpt_dir, content_metadata={"format": "test"})
    req = {
        "rng": ShardedObject("rng", None, (world,), (rank,)),
        "extra": ShardedTensor.from_rank_offsets("not_saved", torch.zeros(2)),
    }
    out, missing, unexpected = dc.load(req, ckpt_dir, strict=dc.StrictHandling.RETURN_ALL,
                                       validate_access_integrity=False)  # fmt: skip
    assert out["rng"]["rank"] == rank and torch.equal(out["rng"]["state"], torch.arange(3) + rank)
    assert out["iteration"] == 7 and "extra" not in out
    assert unexpected == {"not_saved"} and missing == {"w"}
    with pytest.raises(dc.CheckpointingException, match="not_saved"):
        dc.load(req, ckpt_dir, strict="raise_unexpected", validate_access_integrity=False)
    # Megatron's keys and wording: an object by its key, only the non-empty sets named
    only_extra = {"extra": req["extra"]}
    _, missing, unexpected = dc.load(only_extra, ckpt_dir, strict="return_all")
    assert missing == {"w", "rng"} and unexpected == {"not_saved"}
    with pytest.raises(dc.CheckpointingException) as err:
        dc.load(only_extra, ckpt_dir, strict="raise_all")
    assert "Missing keys (for all ranks)" in str(err.value) and "rng/shard" not in str(err.value)
    assert "Unexpected keys (for this rank)" in str(err.value)
    with pytest.raises(dc.CheckpointingException) as err:
        dc.load({"rng": req["rng"]}, ckpt_dir, strict="raise_all")
    assert "Unexpected keys" not in str(err.value) and "'w'" in str(err.value)
    # left to the read, as Megatron leaves it to torch's DCP: its CheckpointException too
    with pytest.raises(DCPCheckpointException, match="not_saved"):
        dc.load(req, ckpt_dir, strict="assume_ok_unexpected", validate_access_integrity=False)
    assert dc.load_content_metadata(ckpt_dir) == {"format": "test"}
    return True


def test_sharded_objects_common_state_and_strict_modes(tmp_path):
    run_distributed(_objects_and_strict, 2, args=(str(tmp_path),))


def _async_vs_sync(root):
    from gigatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    rank, world = dist.get_rank(), dist.get_world_size()
    sync_dir, async_dir = f"{root}/sync", f"{root}/async"
    if rank == 0:
        import os

        os.makedirs(sync_dir), os.makedirs(async_dir)
    dist.barrier()
    sd = _sharded("flat_tp2", rank, world)
    dc.save(sd, sync_dir)
    queue = AsyncCallsQueue()
    queue.schedule_async_request(dc.save(sd, async_dir, async_sharded_save=True))
    sd["w"].data.add_(1.0)  # training goes on: the staged copy is what gets written
    queue.maybe_finalize_async_calls(blocking=True)
    assert queue.get_num_unfinalized_calls() == 0
    return True


def test_async_save_on_4_ranks_writes_the_sync_bytes(tmp_path):
    import os

    run_distributed(_async_vs_sync, 4, args=(str(tmp_path),))
    sync, asyn = tmp_path / "sync", tmp_path / "async"
    names = sorted(n for n in os.listdir(sync) if n != ".metadata")
    assert names == sorted(n for n in os.listdir(asyn) if n != ".metadata")
    for n in names:  # .metadata differs only in its random save id
        assert (sync / n).read_bytes() == (asyn / n).read_bytes(), n
    assert torch.equal(dc.load_plain_tensors(str(asyn))["w"], _full("w"))
