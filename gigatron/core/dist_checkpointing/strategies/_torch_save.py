"""Saving in the `torch_dist` format (see `strategies/torch.py`): the DCP save plan of this rank's
main-replica boxes and ShardedObject payloads, then write (file I/O only) and finalize
(collective: rank 0 writes `.metadata`) as `PendingSave`'s three steps."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from gigatron.core.dist_checkpointing._boxes import box_view, sharded_tensor_boxes
from gigatron.core.dist_checkpointing.core import CheckpointingException, describe_write_error
from gigatron.core.dist_checkpointing.mapping import (
    ShardedObject,
    ShardedTensor,
    is_main_replica,
)


def _rank_world(group=None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _all_gather_object(obj: Any, group=None) -> list:
    _, world = _rank_world(group)
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _standalone(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor owning exactly its elements (torch.save of a view writes the whole storage)."""
    t = t.detach()
    if t.device.type != "cpu":
        return t.to("cpu")
    whole = t.is_contiguous() and t.storage_offset() == 0
    if whole and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.contiguous().clone() if t.is_contiguous() else t.contiguous()


class _SavePlanner(DefaultSavePlanner):
    """Write items straight from our chunk list; DCP's global planning and checks are kept."""

    def __init__(self, chunks: dict, objects: dict):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._chunks = chunks  # fqn -> list[(offsets, sizes, tensor, global_shape)]
        self._objects = objects  # unique_key -> list[data]

    def create_local_plan(self):
        items = []
        for fqn, chunks in self._chunks.items():
            for i, (offsets, sizes, tensor, global_shape) in enumerate(chunks):
                items.append(
                    WriteItem(
                        index=MetadataIndex(fqn, torch.Size(offsets), i),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                            properties=TensorProperties.create_from_tensor(tensor),
                            size=torch.Size(global_shape),
                        ),
                    )
                )
        for key in self._objects:
            items.append(WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO))
        from torch.distributed.checkpoint.planner import SavePlan

        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem):
        fqn = write_item.index.fqn
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            torch.save(self._objects[fqn], buf)
            buf.seek(0)
            return buf
        offsets = tuple(write_item.index.offset)
        for chunk_offsets, _, tensor, _ in self._chunks[fqn]:  # DCP rewrites index hints
            if tuple(chunk_offsets) == offsets:
                return _standalone(tensor)
        raise CheckpointingException(f"{fqn}: no local chunk at offset {offsets}")


def _tensor_chunks(sharded_tensors: list[ShardedTensor]) -> dict:
    chunks: dict[str, list] = {}
    for sh in sharded_tensors:
        if not is_main_replica(sh.replica_id):
            continue
        if sh.data is None:
            raise CheckpointingException(f"{sh.key}: cannot save a ShardedTensor with data None")
        for box in sharded_tensor_boxes(sh):
            chunks.setdefault(sh.key, []).append(
                (box[0], box[1], box_view(sh, box), sh.global_shape)
            )
    return chunks


def _object_payloads(sharded_objects: list[ShardedObject]) -> dict:
    out: dict[str, list] = {}
    for sh in sharded_objects:
        if is_main_replica(sh.replica_id):
            out.setdefault(sh.unique_key, []).append(sh.data)
    return out


def write_on_every_rank(write, checkpoint_dir: str, group=None) -> None:
    """This rank's file writes `write()`, then every rank learns whether any rank's failed and
    raises the same one-line CheckpointingException (ranks, directory, first cause: `ENOSPC
    (No space left on device)`), so no rank waits in the save's next collective. Also a
    barrier. A failure without an OSError behind it (a bug) is re-raised as is where it
    happened."""
    error = None
    try:
        write()
    except Exception as e:
        error = e
    mine = None if error is None else describe_write_error(error)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
    else:
        everyone = [mine]
    failed = [(r, m) for r, m in enumerate(everyone) if m is not None]
    if not failed:
        return
    if error is not None and not _has_os_error(error):
        raise error
    ranks = ", ".join(str(r) for r, _ in failed)
    raise CheckpointingException(
        f"rank{'s' if len(failed) > 1 else ''} {ranks} could not write {checkpoint_dir}: "
        f"{failed[0][1]}"
    ) from error


def _has_os_error(err: BaseException | None) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError):
            return True
        err = err.__cause__ or err.__context__
    return False


@dataclass
class PendingSave:
    """A planned save: `write()` does file I/O only; `finalize()` is collective."""

    writer: FileSystemWriter
    planner: _SavePlanner
    plan: Any
    metadata: Any
    group: Any = None
    results: list = field(default_factory=list)

    def stage(self) -> None:
        """Copy every chunk to private CPU memory so training may change the originals."""
        for chunks in self.planner._chunks.values():
            for i, (o, s, t, g) in enumerate(chunks):
                chunks[i] = (o, s, t.detach().to("cpu", copy=True).contiguous(), g)
        import copy

        self.planner._objects = copy.deepcopy(self.planner._objects)

    def write(self) -> None:
        fut = self.writer.write_data(self.plan, self.planner)
        fut.wait()
        self.results = fut.value()

    def finalize(self) -> None:
        all_results = _all_gather_object(self.results, self.group)

        def finish():  # rank 0 writes `.metadata`; every rank raises if that failed
            if _rank_world(self.group)[0] == 0:
                self.writer.finish(metadata=self.metadata, results=all_results)

        write_on_every_rank(finish, self.writer.path, self.group)


def plan_save(
    sharded_tensors: list[ShardedTensor],
    sharded_objects: list[ShardedObject],
    checkpoint_dir: str,
    *,
    thread_count: int = 1,
    group=None,
) -> PendingSave:
    """Collective: agree on the global DCP plan; returns the rank's pending write."""
    rank, _ = _rank_world(group)
    writer = FileSystemWriter(
        str(checkpoint_dir), single_file_per_rank=True, sync_files=True, thread_count=thread_count
    )
    planner = _SavePlanner(_tensor_chunks(sharded_tensors), _object_payloads(sharded_objects))
    planner.set_up_planner({}, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
    writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
    local_plan = writer.prepare_local_plan(planner.create_local_plan())
    all_plans = _all_gather_object(local_plan, group)
    # Every rank derives the same global plan (pure function of all local plans).
    global_plans, metadata = planner.create_global_plan(all_plans)
    global_plans = writer.prepare_global_plan(global_plans)
    final_plan = planner.finish_plan(global_plans[rank])
    return PendingSave(writer, planner, final_plan, metadata, group)
