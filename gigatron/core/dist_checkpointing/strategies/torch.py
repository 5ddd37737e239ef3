"""The `torch_dist` format: ShardedTensors and ShardedObjects through torch.distributed.checkpoint.

Mirrors `megatron.core.dist_checkpointing.strategies.torch`. Each ShardedTensor key is one DCP
tensor of its global shape; every main-replica box a rank holds is a DCP chunk carrying its
global offsets (a flat shard contributes the few boxes its range covers). Loading asks DCP for
the boxes the *requesting* layout needs, and DCP reads whatever overlapping saved chunks exist,
so any save layout loads at any other. ShardedObjects are BYTE_IO entries under their
`unique_key`, holding `torch.save([data, ...])` as megatron-core writes them.

Saving is split into plan (collective), write (file I/O only: may run in a background thread)
and finalize (collective: rank 0 writes DCP's `.metadata`), so async and sync saves write the
same bytes. Data files are `__{rank}_{n}.distcp`, as megatron-core names them.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException as DCPCheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from gigatron.core.dist_checkpointing._boxes import box_view, sharded_tensor_boxes
from gigatron.core.dist_checkpointing._safe_load import restricted_pickle_load, safe_torch_load
from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.dict_utils import nested_items_with_path, set_at_path
from gigatron.core.dist_checkpointing.mapping import (
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
    is_main_replica,
)

__all__ = [
    "TorchDistLoadShardedStrategy",
    "TorchDistSaveShardedStrategy",
    "PendingSave",
    "SafeFileSystemReader",
    "plan_save",
    "load_sharded",
    "read_dcp_metadata",
]


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
        if _rank_world(self.group)[0] == 0:
            self.writer.finish(metadata=self.metadata, results=all_results)
        if _rank_world(self.group)[1] > 1:
            dist.barrier(group=self.group)


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


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose `.metadata` unpickling is restricted to DCP's classes."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = restricted_pickle_load(f, what=f"DCP metadata {path}")
        except FileNotFoundError as e:
            raise CheckpointingException(
                f"{path} is missing: not a torch_dist checkpoint or an unfinished save"
            ) from e
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner):
        """DCP's read, one file at a time, so a file that fails is named: each file is checked
        to hold every byte range the metadata gives it (empty and truncated files are caught
        before torch parses them), and any error while reading it becomes a one-line
        CheckpointingException naming it as damaged."""
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        for relative_path, items in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            self._check_size(path, items)
            try:
                super().read_data(replace(plan, items=items), planner).wait()
            except CheckpointingException:
                raise
            except Exception as e:
                raise CheckpointingException(
                    f"{path} is damaged (cannot be read as the checkpoint's metadata describes "
                    f"it): {type(e).__name__}: {_first_line(e)}"
                ) from None
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _check_size(self, path, items: list[ReadItem]) -> None:
        need = max(self.storage_data[i.storage_index].offset
                   + self.storage_data[i.storage_index].length for i in items)  # fmt: skip
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise CheckpointingException(
                f"{path} is missing or unreadable: the checkpoint is damaged ({e.strerror})"
            ) from None
        if size < need:
            raise CheckpointingException(
                f"{path} is damaged: truncated to {size} bytes, the checkpoint's metadata needs "
                f"at least {need}"
            )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else "(no message)"


def read_dcp_metadata(checkpoint_dir: str):
    """DCP `Metadata` of a checkpoint (read safely)."""
    return SafeFileSystemReader(str(checkpoint_dir)).read_metadata()


class _LoadPlanner(LoadPlanner):
    """Reads the boxes each requested ShardedTensor covers, from any saved chunking."""

    def __init__(self, sharded_tensors: list[ShardedTensor], object_keys: list[str]):
        self._tensors = sharded_tensors
        self._object_keys = object_keys
        self._dest: dict[str, list[torch.Tensor]] = {}
        self.loaded_objects: dict[str, Any] = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        md_all = self.metadata.state_dict_metadata
        requests: dict[str, list] = {}
        for sh in self._tensors:
            md = md_all.get(sh.key)
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointingException(
                    f"tensor {sh.key!r} is not in the checkpoint "
                    f"(it has {len(md_all)} entries, e.g. {sorted(md_all)[:5]})"
                )
            if tuple(md.size) != tuple(sh.global_shape) and not sh.allow_shape_mismatch:
                raise CheckpointingException(_shape_error(sh, md))
            for box in sharded_tensor_boxes(sh):
                requests.setdefault(sh.key, []).append((box, box_view(sh, box), sh))
        items: list[ReadItem] = []
        for fqn, reqs in requests.items():
            self._dest[fqn] = [view for _, view, _ in reqs]
            chunks = [ChunkStorageMetadata(torch.Size(b[0]), torch.Size(b[1])) for b, _, _ in reqs]
            new = create_read_items_for_chunk_list(fqn, md_all[fqn], chunks)
            _check_coverage(fqn, md_all[fqn], reqs, new)
            items += new
        for key in self._object_keys:
            if not isinstance(md_all.get(key), BytesStorageMetadata):
                raise CheckpointingException(f"object {key!r} is not in the checkpoint")
            idx = MetadataIndex(key)
            items.append(
                ReadItem(
                    type=LoadItemType.BYTE_IO,
                    dest_index=idx,
                    dest_offsets=torch.Size((0,)),
                    storage_index=idx,
                    storage_offsets=torch.Size((0,)),
                    lengths=torch.Size((0,)),
                )
            )
        return LoadPlan(items)

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, central_plan):
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        self.loaded_objects[key] = safe_torch_load(value, what=f"object {key!r}")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        dest = self._dest[read_item.dest_index.fqn][read_item.dest_index.index]
        return _narrow(dest, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor returned a view of the destination; the reader copied into it


def _narrow(t: torch.Tensor, offsets, lengths) -> torch.Tensor:
    for dim, (o, n) in enumerate(zip(offsets, lengths)):
        if o != 0 or n != t.size(dim):
            t = t.narrow(dim, o, n)
    return t


def _check_coverage(fqn, md, reqs, read_items) -> None:
    """Every requested element inside the saved global shape must be read from some chunk."""
    got = [0] * len(reqs)
    for item in read_items:
        got[item.dest_index.index] += math.prod(item.lengths)
    for i, ((offs, sizes, _), _, _sh) in enumerate(reqs):
        inside = math.prod(max(0, min(o + s, g) - o) for o, s, g in zip(offs, sizes, md.size))
        if got[i] != inside:
            raise CheckpointingException(
                f"{fqn}: the checkpoint covers {got[i]} of the {inside} requested elements at "
                f"offset {offs} size {sizes}: incomplete or damaged checkpoint"
            )


def _shape_error(sh: ShardedTensor, md: TensorStorageMetadata) -> str:
    # Only the padded vocabulary rows (embedding, output layer) may differ on load.
    return (
        f"{sh.key}: global shape in checkpoint {tuple(md.size)} != requested "
        f"{tuple(sh.global_shape)}: the model flags differ from the checkpoint's"
    )


def _precheck(sharded_tensors, object_keys, checkpoint_dir) -> None:
    """Clear errors for absent keys or wrong global shapes before DCP (which wraps errors)."""
    md_all = read_dcp_metadata(checkpoint_dir).state_dict_metadata
    for sh in sharded_tensors:
        md = md_all.get(sh.key)
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointingException(
                f"{checkpoint_dir}: tensor {sh.key!r} is not in the checkpoint"
            )
        if tuple(md.size) != tuple(sh.global_shape) and not sh.allow_shape_mismatch:
            raise CheckpointingException(f"{checkpoint_dir}: {_shape_error(sh, md)}")
    for key in object_keys:
        if not isinstance(md_all.get(key), BytesStorageMetadata):
            raise CheckpointingException(
                f"{checkpoint_dir}: object {key!r} is not in the checkpoint"
            )


def _first_failure(e: DCPCheckpointException, checkpoint_dir) -> CheckpointingException:
    """DCP gathers each failing rank's exception (with its traceback) on every rank; keep the
    first cause as one line, so all ranks report the same thing."""
    for rank, (cause, _trace) in sorted(e.failures.items()):
        if isinstance(cause, CheckpointingException):
            return CheckpointingException(f"{cause} (seen on rank {rank})")
        return CheckpointingException(
            f"{checkpoint_dir}: loading failed on rank {rank}: {type(cause).__name__}: "
            f"{_first_line(cause)}"
        )
    return CheckpointingException(f"{checkpoint_dir}: loading failed: {_first_line(e)}")


def load_sharded(
    sharded_tensors: list[ShardedTensor], object_keys: list[str], checkpoint_dir: str
) -> dict[str, Any]:
    """Fill every ShardedTensor's `data` in place (allocating on the CPU when None); return
    objects by key. Device tensors are filled where they are: the reader copies each chunk
    straight into a view of the destination (no CPU staging copy, no second allocation)."""
    originals = []  # non-contiguous destinations: read into a contiguous twin, copy back
    for sh in sharded_tensors:
        original = None
        if sh.data is None:
            sh.init_data("cpu", init_fn=torch.zeros if sh.allow_shape_mismatch else torch.empty)
        else:
            sh.data = sh.data.detach()
            if not sh.data.is_contiguous():
                original, sh.data = sh.data, sh.data.contiguous()
            if sh.allow_shape_mismatch:
                sh.data.zero_()
        originals.append(original)
    _precheck(sharded_tensors, object_keys, checkpoint_dir)
    planner = _LoadPlanner(sharded_tensors, object_keys)
    no_dist = not (dist.is_available() and dist.is_initialized())
    try:
        dcp_load({}, storage_reader=SafeFileSystemReader(str(checkpoint_dir)), planner=planner,
                 no_dist=no_dist)  # fmt: skip
    except DCPCheckpointException as e:  # gathered from every rank: re-raise the cause, one line
        raise _first_failure(e, checkpoint_dir) from None
    for sh, original in zip(sharded_tensors, originals):
        if original is not None:
            original.copy_(sh.data)
            sh.data = original
    return planner.loaded_objects


# Megatron's strategy objects: `dist_checkpointing.save(sd, dir, sharded_strategy=
# TorchDistSaveShardedStrategy(thread_count=2))` and `load(..., sharded_strategy=
# TorchDistLoadShardedStrategy())` take them; their own save / load handle only the sharded part
# (ShardedTensors, ShardedObjects), as Megatron's do under serialization.save / load.


def _sharded_leaves(sharded_state_dict) -> tuple[list, list]:
    tensors, objects = [], []
    for path, v in nested_items_with_path(sharded_state_dict):
        if isinstance(v, ShardedTensorFactory):
            raise CheckpointingException(
                f"{path}: apply_factories before calling a strategy directly "
                "(dist_checkpointing.save/load do it)"
            )
        if isinstance(v, ShardedTensor):
            tensors.append((path, v))
        elif isinstance(v, ShardedObject):
            objects.append((path, v))
    return tensors, objects


class TorchDistSaveShardedStrategy:
    """Save ShardedTensors / ShardedObjects with torch.distributed.checkpoint (`torch_dist`, 1).

    thread_count: writer threads per rank (files per rank). keep_only_main_replica must stay
    True and cached_metadata, separation_hint, cpu_shm_mode at their defaults: gigatron always
    writes main replicas only and has no metadata cache, per-prefix files or shared-memory
    staging (another value raises ValueError).
    """

    def __init__(
        self,
        backend: str = "torch_dist",
        version: int = 1,
        keep_only_main_replica: bool = True,
        thread_count: int = 1,
        cached_metadata: bool = False,
        separation_hint: str | None = None,
        cpu_shm_mode: bool = False,
    ):
        if (backend, version) != ("torch_dist", 1):
            raise ValueError(
                f"TorchDistSaveShardedStrategy(backend={backend!r}, version={version!r}): "
                "gigatron writes only ('torch_dist', 1)"
            )
        refused = {
            "keep_only_main_replica": (keep_only_main_replica, True),
            "cached_metadata": (cached_metadata, False),
            "separation_hint": (separation_hint, None),
            "cpu_shm_mode": (cpu_shm_mode, False),
        }
        for name, (value, default) in refused.items():
            if value != default:
                raise ValueError(
                    f"TorchDistSaveShardedStrategy({name}={value!r}) is not supported by "
                    f"gigatron; leave it at {default!r} (docs/compat.md)"
                )
        if thread_count < 1:
            raise ValueError(f"thread_count ({thread_count}) must be >= 1")
        self.backend, self.version = backend, version
        self.keep_only_main_replica = keep_only_main_replica
        self.thread_count = thread_count
        self.cached_metadata = cached_metadata
        self.separation_hint = separation_hint
        self.cpu_shm_mode = cpu_shm_mode

    def can_handle_sharded_objects(self) -> bool:
        return True

    def save(self, sharded_state_dict, checkpoint_dir: str | Path, process_group=None) -> None:
        """Collective: write the sharded leaves (no common state, no metadata.json)."""
        tensors, objects = _sharded_leaves(sharded_state_dict)
        pending = plan_save(
            [t for _, t in tensors],
            [o for _, o in objects],
            str(checkpoint_dir),
            thread_count=self.thread_count,
            group=process_group,
        )
        pending.write()
        pending.finalize()


class TorchDistLoadShardedStrategy:
    """Load what a sharded state dict describes from a `torch_dist` checkpoint, any layout.

    cache_metadata and checkpoint_name (Megatron's metadata cache) are accepted; gigatron
    reads the DCP metadata on each load.
    """

    def __init__(self, cache_metadata: bool = False, checkpoint_name: str | None = None):
        self.backend, self.version = "torch_dist", 1
        self.cache_metadata = cache_metadata
        self.checkpoint_name = checkpoint_name
        self.cached_global_metadata: Metadata | None = None

    def can_handle_sharded_objects(self) -> bool:
        return True

    def check_backend_compatibility(self, loaded_backend: str) -> None:
        if loaded_backend != "torch_dist":
            raise CheckpointingException(
                f"checkpoint backend {loaded_backend!r}: this strategy reads 'torch_dist'"
            )

    def check_version_compatibility(self, loaded_version: int) -> None:
        if loaded_version != 1:
            raise CheckpointingException(f"torch_dist version {loaded_version}: gigatron reads 1")

    def load(self, sharded_state_dict, checkpoint_dir: str | Path) -> dict:
        """The request's structure with each ShardedTensor's data (filled in place) and each
        ShardedObject's payload; other leaves are dropped."""
        tensors, objects = _sharded_leaves(sharded_state_dict)
        keys = sorted({o.unique_key for _, o in objects})
        loaded = load_sharded([t for _, t in tensors], keys, str(checkpoint_dir))
        out: dict[Any, Any] = {}
        for path, t in tensors:
            set_at_path(out, path, t.data)
        for path, o in objects:
            payload = loaded[o.unique_key]
            set_at_path(out, path, payload[0] if isinstance(payload, list) and payload else payload)
        return out

    def load_tensors_metadata(self, checkpoint_dir: str | Path, metadata=None) -> dict:
        """{key: ShardedTensor without data} with each stored tensor's global shape and dtype."""
        metadata = metadata or read_dcp_metadata(str(checkpoint_dir))
        out = {}
        for key, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                shape = tuple(md.size)
                out[key] = ShardedTensor(
                    key, None, md.properties.dtype, shape, shape, (0,) * len(shape),
                    (1,) * len(shape),
                )  # fmt: skip
        return out

    def load_sharded_metadata(self, checkpoint_dir: str | Path) -> dict:
        """`load_tensors_metadata` plus ShardedObjects (data None) by unique key."""
        metadata = read_dcp_metadata(str(checkpoint_dir))
        out: dict[str, Any] = {}
        for key, md in metadata.state_dict_metadata.items():
            if isinstance(md, BytesStorageMetadata) and "/shard_" in key:
                obj = ShardedObject.empty_from_unique_key(key)
                out[obj.unique_key] = obj
        out.update(self.load_tensors_metadata(checkpoint_dir, metadata))
        return out

    def remove_sharded_tensors(self, checkpoint_dir: str | Path, key_prefix: str) -> None:
        """Drop every entry whose key starts with `key_prefix` from the DCP metadata, and
        delete the data files that then hold nothing (one rank; Megatron's semantics, without
        its per-prefix files: a file shared with kept entries stays)."""
        checkpoint_dir = str(checkpoint_dir)
        old = read_dcp_metadata(checkpoint_dir)
        if not any(k.startswith(key_prefix) for k in old.state_dict_metadata):
            warnings.warn(
                f"no entries in {checkpoint_dir} begin with {key_prefix!r}; nothing removed",
                stacklevel=2,
            )
            return
        keep = {k: v for k, v in old.state_dict_metadata.items() if not k.startswith(key_prefix)}
        storage = {i: s for i, s in (old.storage_data or {}).items() if i.fqn in keep}
        planner = {k: v for k, v in (old.planner_data or {}).items() if k in keep}
        new = Metadata(state_dict_metadata=keep, planner_data=planner, storage_data=storage)
        new.storage_meta = old.storage_meta
        used = {s.relative_path for s in storage.values()}
        dropped = {s.relative_path for s in (old.storage_data or {}).values()} - used
        # finish() rebuilds storage_data from write results: hand it the kept entries as such
        kept = [WriteResult(i, s.length, s) for i, s in storage.items()]
        FileSystemWriter(checkpoint_dir).finish(metadata=new, results=[kept])
        for name in dropped:
            os.remove(os.path.join(checkpoint_dir, name))
