"""A damaged checkpoint file is named, as damaged, on every rank.

Two gloo ranks save a row-split tensor (one `.distcp` file per rank) and a common state. Then
one file is damaged (an empty or truncated `common.pt`, `.distcp` of rank 1, or `.metadata`)
and both ranks load: each must raise `CheckpointingException` whose one-line message names the
damaged file and says the checkpoint is damaged (rank 0 reads only its own `.distcp`, so it
learns of rank 1's file from its peer).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


DAMAGES = (
    "common_truncated", "common_empty", "distcp_empty", "distcp_truncated", "metadata_truncated",
)  # fmt: skip


def _state(rank: int, world: int, fill: float):
    from gigatron.core import dist_checkpointing as dc

    local = torch.full((4, 3), fill + rank)
    return {
        "w": dc.ShardedTensor.from_rank_offsets("w", local, (0, rank, world)),
        "note": {"iteration": 7},
    }


def _damage(ckpt_dir: str, how: str) -> str:
    name = {"common": "common.pt", "distcp": "__1_0.distcp", "metadata": ".metadata"}
    path = os.path.join(ckpt_dir, name[how.split("_")[0]])
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(b"" if how.endswith("_empty") else raw[: len(raw) // 2])
    return path


def _worker(root: str) -> dict:
    from gigatron.core import dist_checkpointing as dc

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for how in DAMAGES:
        ckpt_dir = os.path.join(root, how)
        if rank == 0:
            os.makedirs(ckpt_dir)
        dist.barrier()
        dc.save(_state(rank, world, 1.0), ckpt_dir)
        dist.barrier()
        loaded = dc.load(_state(rank, world, 0.0), ckpt_dir)  # intact: loads
        assert torch.equal(loaded["w"], torch.full((4, 3), 1.0 + rank))
        dist.barrier()
        path = _damage(ckpt_dir, how) if rank == 0 else None
        dist.barrier()
        try:
            dc.load(_state(rank, world, 0.0), ckpt_dir)
            out[how] = "loaded"
        except dc.CheckpointingException as e:
            out[how] = str(e)
        except BaseException as e:  # noqa: BLE001 - the test reports what else came out
            out[how] = f"{type(e).__name__}: {e}"
        if rank == 0:
            out[how + ".path"] = path
        dist.barrier()
    return out


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_file_is_named_on_every_rank(tmp_path, how, _results={}):  # noqa: B006
    if not _results:  # one spawned group runs every case
        _results.update(enumerate(run_distributed(_worker, 2, args=(str(tmp_path),))))
    path = _results[0][how + ".path"]
    for rank in (0, 1):
        msg = _results[rank][how]
        assert os.path.basename(path) in msg and "damaged" in msg, (rank, msg)
        assert "\n" not in msg and "Traceback" not in msg, (rank, msg)
