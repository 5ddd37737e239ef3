"""Loading from the `torch_dist` format (see `strategies/torch.py`): DCP reads of the boxes the
requesting layout needs, through a reader that checks every file before using it (no pickle
runs, sizes checked), with coverage and shape checks that name the key and the file."""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, Metadata
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException as DCPCheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.futures import Future

from gigatron.core.dist_checkpointing._boxes import box_view, sharded_tensor_boxes
from gigatron.core.dist_checkpointing._safe_load import restricted_pickle_load, safe_torch_load
from gigatron.core.dist_checkpointing.core import CheckpointingException, DamagedCheckpointError
from gigatron.core.dist_checkpointing.mapping import (
    ShardedTensor,
)
from gigatron.core.untrusted_files import (
    LIMITS,
    UntrustedFileError,
    check_regular_file,
    confined_path,
    open_regular_file,
)


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose `.metadata` unpickling is restricted to DCP's classes, and whose
    files are regular files inside the checkpoint directory, read within the sizes declared."""

    _memo_metadata = True  # share an unpickled `.metadata` with other reads of the same bytes

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            f = open_regular_file(path, what="DCP metadata", max_bytes="dcp_metadata")
        except FileNotFoundError as e:
            raise DamagedCheckpointError(
                f"{path} is missing: not a torch_dist checkpoint or an unfinished save"
            ) from e
        except UntrustedFileError as e:
            raise DamagedCheckpointError(f"{e}: the checkpoint is damaged") from None
        with f:
            metadata = _unpickle_metadata(f, path, memo=self._memo_metadata)
        _check_storage_data(metadata, self.path, path)
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
            path = self._data_path(relative_path)
            self._check_size(path, items)
            try:
                super().read_data(replace(plan, items=items), planner).wait()
            except CheckpointingException:
                raise
            except Exception as e:
                raise DamagedCheckpointError(
                    f"{path} is damaged (cannot be read as the checkpoint's metadata describes "
                    f"it): {type(e).__name__}: {_first_line(e)}"
                ) from None
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _data_path(self, relative_path: str) -> str:
        """The data file a `.metadata` entry names, confined to the checkpoint directory."""
        try:
            return confined_path(self.path, relative_path, what="data file",
                                 source=f"DCP metadata {self._get_metadata_path()}")  # fmt: skip
        except UntrustedFileError as e:
            raise DamagedCheckpointError(str(e)) from None

    def _check_size(self, path, items: list[ReadItem]) -> None:
        need = max(self.storage_data[i.storage_index].offset
                   + self.storage_data[i.storage_index].length for i in items)  # fmt: skip
        try:
            size = check_regular_file(path, what="checkpoint data file")
        except OSError as e:
            raise DamagedCheckpointError(
                f"{path} is missing or unreadable: the checkpoint is damaged ({e.strerror})"
            ) from None
        except UntrustedFileError as e:
            raise DamagedCheckpointError(f"{e}: the checkpoint is damaged") from None
        if size < need:
            raise DamagedCheckpointError(
                f"{path} is damaged: truncated to {size} bytes, the checkpoint's metadata needs "
                f"at least {need}"
            )


_METADATA_MEMO: OrderedDict[tuple[str, bytes], Metadata] = OrderedDict()
_METADATA_MEMO_SIZE = 2


def _unpickle_metadata(f, path: str, *, memo: bool = True) -> Metadata:
    """The `Metadata` pickled in the open file `f`, unpickled once per content.

    The restricted unpickler is pure Python (about 3x the C one: seconds for a large model's
    `.metadata`), and one load reads the metadata several times (key checks, shape checks,
    DCP's own read), so the last few are kept, keyed on the resolved path and a digest of the
    bytes: a rewritten file is read afresh. The object is shared: its readers must not change
    it (none does; `remove_sharded_tensors` builds a new one)."""
    data = f.read(LIMITS["dcp_metadata"] + 1)
    if len(data) > LIMITS["dcp_metadata"]:
        raise CheckpointingException(f"DCP metadata {path} grew past its size limit while read")
    key = (os.path.realpath(path), hashlib.blake2b(data, digest_size=32).digest())
    metadata = _METADATA_MEMO.get(key) if memo else None
    if metadata is not None:
        _METADATA_MEMO.move_to_end(key)
        return metadata
    metadata = restricted_pickle_load(io.BytesIO(data), what=f"DCP metadata {path}")
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpointError(
            f"DCP metadata {path} holds {_kind(metadata)}, not torch.distributed.checkpoint "
            "Metadata: the checkpoint is damaged or not a torch_dist checkpoint"
        )
    if not memo:
        return metadata
    _METADATA_MEMO[key] = metadata
    while len(_METADATA_MEMO) > _METADATA_MEMO_SIZE:
        _METADATA_MEMO.popitem(last=False)
    return metadata


def _kind(value) -> str:
    return "None" if value is None else f"a {type(value).__module__}.{type(value).__qualname__}"


def _check_storage_data(metadata: Metadata, root, path: str) -> None:
    """Every data file `.metadata` names lies inside `root` (no absolute path, no `..`, no
    symlink out), and every byte range it declares is a non-negative offset and length."""
    storage = metadata.storage_data
    if storage is None:
        return
    if not isinstance(storage, dict):
        raise DamagedCheckpointError(
            f"DCP metadata {path} holds storage data of {_kind(storage)}, not a dict: the "
            "checkpoint is damaged"
        )
    names = set()
    for index, info in storage.items():
        if not isinstance(info, _StorageInfo):
            raise DamagedCheckpointError(
                f"DCP metadata {path}: the storage entry of {getattr(index, 'fqn', index)!r} is "
                f"{_kind(info)}, not a data file range: the checkpoint is damaged"
            )
        for field in ("offset", "length"):
            value = getattr(info, field)
            if type(value) is not int or value < 0:
                raise DamagedCheckpointError(
                    f"DCP metadata {path} declares {field} {value!r} in {info.relative_path!r} "
                    f"for {getattr(index, 'fqn', index)!r}: a byte {field} is an integer >= 0; "
                    "the checkpoint is damaged"
                )
        names.add(info.relative_path)
    for name in sorted(names, key=str):
        try:
            confined_path(root, name, what="data file", source=f"DCP metadata {path}")
        except UntrustedFileError as e:
            raise DamagedCheckpointError(str(e)) from None


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
            raise DamagedCheckpointError(
                f"{fqn}: the checkpoint covers {got[i]} of the {inside} requested elements at "
                f"offset {offs} size {sizes}: incomplete or damaged checkpoint"
            )


def _shape_error(sh: ShardedTensor, md: TensorStorageMetadata) -> str:
    # Only the padded vocabulary rows (embedding, output layer) may differ on load.
    return (
        f"{sh.key}: global shape in checkpoint {tuple(md.size)} != requested "
        f"{tuple(sh.global_shape)}: the model flags differ from the checkpoint's"
    )


class KeyNotInCheckpointError(CheckpointingException, DCPCheckpointException):
    """A requested key the checkpoint lacks, found before the read. Also torch's DCP
    `CheckpointException`, which Megatron's load raises there (its strategy reads first), so
    `StrictHandling.ASSUME_OK_UNEXPECTED` callers catch what they catch on Megatron."""

    def __init__(self, msg: str) -> None:
        DCPCheckpointException.__init__(self, msg, {})

    def __str__(self) -> str:
        return self.args[0]


def _precheck(sharded_tensors, object_keys, checkpoint_dir) -> None:
    """Clear errors for absent keys or wrong global shapes before DCP (which wraps errors)."""
    md_all = read_dcp_metadata(checkpoint_dir).state_dict_metadata
    for sh in sharded_tensors:
        md = md_all.get(sh.key)
        if not isinstance(md, TensorStorageMetadata):
            raise KeyNotInCheckpointError(
                f"{checkpoint_dir}: tensor {sh.key!r} is not in the checkpoint"
            )
        if tuple(md.size) != tuple(sh.global_shape) and not sh.allow_shape_mismatch:
            raise CheckpointingException(f"{checkpoint_dir}: {_shape_error(sh, md)}")
    for key in object_keys:
        if not isinstance(md_all.get(key), BytesStorageMetadata):
            raise KeyNotInCheckpointError(
                f"{checkpoint_dir}: object {key!r} is not in the checkpoint"
            )


def _first_failure(e: DCPCheckpointException, checkpoint_dir) -> CheckpointingException:
    """DCP gathers each failing rank's exception (with its traceback) on every rank; keep the
    first cause as one line, so all ranks report the same thing."""
    for rank, (cause, _trace) in sorted(e.failures.items()):
        if isinstance(cause, CheckpointingException):
            return type(cause)(f"{cause} (seen on rank {rank})")
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
