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

import os
import warnings
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.storage import WriteResult

from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.dict_utils import nested_items_with_path, set_at_path
from gigatron.core.dist_checkpointing.mapping import (  # noqa: F401 (Megatron's names here)
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
    is_main_replica,
)
from gigatron.core.dist_checkpointing.strategies._torch_load import (
    SafeFileSystemReader,
    load_sharded,
    read_dcp_metadata,
)
from gigatron.core.dist_checkpointing.strategies._torch_save import (  # noqa: F401
    PendingSave,
    _all_gather_object,  # validation / serialization gather through these
    _rank_world,
    plan_save,
    write_on_every_rank,
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
