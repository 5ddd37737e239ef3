"""`save` and `load` of sharded state dicts in Megatron's `torch_dist` format.

Mirrors `megatron.core.dist_checkpointing.serialization`. A checkpoint directory holds:
  - `__{rank}_{n}.distcp` + `.metadata`: torch.distributed.checkpoint data (ShardedTensors under
    their keys with per-chunk global offsets; ShardedObjects as bytes under their unique keys);
  - `common.pt`: everything that is not sharded, written by rank 0 (megatron-core 0.16 layout);
  - `metadata.json`: {"sharded_backend": "torch_dist", ...}, written last, so its presence
    means the save completed;
  - optionally `integrity_sha256.json`: SHA-256 per file, checked by load(verify_integrity=True).

gigatron differences: `common.pt`, objects and DCP metadata are read through an allow-list
(never unrestricted pickle); `load` also accepts `strict=True/False`; ShardedTensorFactory and
flattened ranges work with every layout.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from gigatron.core.dist_checkpointing import _integrity
from gigatron.core.dist_checkpointing._replica_check import check_replicas_equal
from gigatron.core.dist_checkpointing._safe_load import safe_torch_load
from gigatron.core.dist_checkpointing.core import (
    CheckpointingConfig,
    CheckpointingException,
    DamagedCheckpointError,
    maybe_load_config,
    save_config,
)
from gigatron.core.dist_checkpointing.dict_utils import (
    extract_matching_values,
    nested_items_with_path,
    set_at_path,
)
from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedBase,
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
    StateDict,
)
from gigatron.core.dist_checkpointing.strategies import torch as torch_dist
from gigatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
from gigatron.core.dist_checkpointing.strategies.common import (
    COMMON_STATE_FNAME,
    atomic_torch_save,
)
from gigatron.core.dist_checkpointing.validation import (
    StrictHandling,
    gather_compact_metadata,
    parse_strict_flag,
    validate_sharding_integrity,
)
from gigatron.core.untrusted_files import UntrustedFileError, open_regular_file

logger = logging.getLogger(__name__)

_CONTENT_METADATA_KEY = "content_metadata"
_BACKEND = ("torch_dist", 1)

__all__ = [
    "save",
    "load",
    "load_common_state_dict",
    "load_tensors_metadata",
    "load_sharded_metadata",
    "load_plain_tensors",
    "load_content_metadata",
    "remove_sharded_tensors",
    "get_default_save_sharded_strategy",
    "get_default_load_sharded_strategy",
]


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _check_strategy(strategy, name: str) -> None:
    if strategy is None:
        return
    backend = tuple(strategy) if isinstance(strategy, tuple) else getattr(strategy, "backend", None)
    if backend not in (_BACKEND, _BACKEND[0]):
        raise ValueError(f"{name} ({strategy!r}) must be None or ('torch_dist', 1)")


@dataclass(frozen=True)
class DefaultShardedStrategy:
    """gigatron's one sharded strategy, torch.distributed.checkpoint ('torch_dist', v1), as the
    object Megatron's `get_default_*_sharded_strategy` return; `save`/`load` accept it."""

    backend: str = "torch_dist"
    version: int = 1
    action: str = "save"  # "save" or "load"


def get_default_save_sharded_strategy(
    backend: str = "torch_dist", version: int = 1
) -> DefaultShardedStrategy:
    """Megatron's default save strategy; gigatron writes only ('torch_dist', 1)."""
    if (backend, version) != _BACKEND:
        raise ValueError(
            f"get_default_save_sharded_strategy(backend={backend!r}, version={version!r}): "
            "gigatron saves only ('torch_dist', 1) (gigatron/core/dist_checkpointing/"
            "serialization.py)"
        )
    return DefaultShardedStrategy(backend, version, "save")


def get_default_load_sharded_strategy(checkpoint_dir: str | None = None) -> DefaultShardedStrategy:
    """The load strategy, for `checkpoint_dir` after checking its `metadata.json` (Megatron's
    `verify_checkpoint_and_load_strategy`; CheckpointingException if it is not a torch_dist
    checkpoint), or without a directory (megatron-core 0.19) the default one."""
    if checkpoint_dir is not None:
        _verify_checkpoint(checkpoint_dir)
    return DefaultShardedStrategy(*_BACKEND, "load")


def _copy_structure(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _copy_structure(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy_structure(v) for v in x]
    return x


def _apply_factories(sd: Any) -> list[tuple[tuple, ShardedTensorFactory]]:
    """Replace each factory by what it builds (in place); return (path, factory) pairs."""
    factories = [
        (p, v) for p, v in nested_items_with_path(sd) if isinstance(v, ShardedTensorFactory)
    ]
    for path, fac in factories:
        set_at_path(sd, path, fac.build())
    return factories


def _split(sd: Any):
    """(ShardedTensors with paths, ShardedObjects with paths, nonpersistent with paths)."""
    tensors, objects, local = [], [], []
    for path, v in nested_items_with_path(sd):
        if isinstance(v, ShardedTensor):
            tensors.append((path, v))
        elif isinstance(v, ShardedObject):
            objects.append((path, v))
        elif isinstance(v, LocalNonpersistentObject):
            local.append((path, v))
        elif isinstance(v, ShardedBase):
            raise CheckpointingException(f"unsupported sharded leaf {type(v).__name__} at {path}")
    return tensors, objects, local


def _common_part(sd: Any) -> Any:
    sharded = (ShardedBase, LocalNonpersistentObject)
    return extract_matching_values(sd, lambda v: isinstance(v, sharded))[1]


def save(
    sharded_state_dict: StateDict,
    checkpoint_dir: str,
    sharded_strategy=None,
    validate_access_integrity: bool = True,
    async_sharded_save: bool = False,
    preprocess_common_before_consistancy_check=None,
    content_metadata: dict | None = None,
    async_strategy: str = "nvrx",
    verify_integrity: bool = False,
    process_group=None,
    *,
    common_strategy=None,
) -> AsyncRequest | None:
    """Write `sharded_state_dict` to the existing directory `checkpoint_dir` (collective).

    Parameter order of megatron-core 0.19, which dropped `common_strategy` (0.16's fourth
    parameter; here keyword-only, and like `sharded_strategy` only the default torch_dist one).
    `async_strategy` (Megatron 0.19+: "nvrx" or "mcore", which of its async writers runs the
    `async_sharded_save` request) is accepted with either value: gigatron has one.

    With `async_sharded_save` the tensors are first copied to private CPU memory, and the
    returned AsyncRequest does the file writes (schedule it, e.g. with AsyncCallsQueue); its
    finalize step writes DCP's `.metadata`, the optional integrity file and `metadata.json`.
    `verify_integrity` writes `integrity_sha256.json`.
    """
    if not isinstance(validate_access_integrity, bool):  # a 0.16-style positional call
        raise TypeError(
            f"validate_access_integrity must be a bool, got {validate_access_integrity!r}: "
            "megatron-core 0.19 removed common_strategy from the fourth position; pass it (and "
            "what follows) by keyword"
        )
    _check_strategy(sharded_strategy, "sharded_strategy")
    _check_strategy(common_strategy, "common_strategy")
    if async_strategy not in ("nvrx", "mcore"):
        raise CheckpointingException(
            f"async_strategy {async_strategy!r} is not one of Megatron's 'nvrx' / 'mcore'"
        )
    del preprocess_common_before_consistancy_check  # common state is taken from rank 0 only
    checkpoint_dir = str(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointingException(
            f"checkpoint_dir {checkpoint_dir!r} must be an existing directory"
        )
    rank = _rank()
    if rank == 0 and next(os.scandir(checkpoint_dir), None) is not None:
        logger.warning("Overwriting old incomplete / corrupted checkpoint in %s", checkpoint_dir)
    sd = _copy_structure(sharded_state_dict)
    if content_metadata is not None:
        sd[_CONTENT_METADATA_KEY] = content_metadata
    _apply_factories(sd)
    if hasattr(sharded_strategy, "apply_saving_parallelization"):  # FullyParallelSave...Wrapper
        sharded_strategy.apply_saving_parallelization(sd)  # moves main replicas (collective)
    tensors, objects, _ = _split(sd)
    tensors, objects = [t for _, t in tensors], [o for _, o in objects]
    if validate_access_integrity:
        _, global_md = gather_compact_metadata(tensors, objects, process_group)
        validate_sharding_integrity(global_md)
        check_replicas_equal(tensors, process_group)
    common_path = os.path.join(checkpoint_dir, COMMON_STATE_FNAME)
    torch_dist.write_on_every_rank(
        lambda: rank == 0 and atomic_torch_save(_common_part(sd), common_path),
        checkpoint_dir,
        process_group,
    )
    threads = getattr(sharded_strategy, "thread_count", 1)  # TorchDistSaveShardedStrategy's
    pending = torch_dist.plan_save(
        tensors, objects, checkpoint_dir, thread_count=threads, group=process_group
    )

    def finalize():
        pending.finalize()  # DCP .metadata on rank 0; every rank raises if that failed

        def config():
            if rank == 0:
                if verify_integrity:
                    _integrity.write_manifest(checkpoint_dir)
                save_config(CheckpointingConfig(*_BACKEND), checkpoint_dir)

        torch_dist.write_on_every_rank(config, checkpoint_dir, process_group)

    if not async_sharded_save:
        torch_dist.write_on_every_rank(pending.write, checkpoint_dir, process_group)
        finalize()
        return None
    pending.stage()
    return AsyncRequest(pending.write, (), [finalize])


def _verify_checkpoint(checkpoint_dir: str) -> None:
    config = maybe_load_config(checkpoint_dir)
    if config is None:
        raise CheckpointingException(
            f"{checkpoint_dir} is not a distributed checkpoint (no metadata.json: missing "
            "directory or an unfinished save)"
        )
    if config.sharded_backend != "torch_dist":
        raise CheckpointingException(
            f"{checkpoint_dir}: sharded_backend {config.sharded_backend!r} is not supported "
            "(only 'torch_dist')"
        )


def load(
    sharded_state_dict: StateDict,
    checkpoint_dir: str,
    sharded_strategy=None,
    validate_access_integrity: bool = True,
    strict: str | StrictHandling | bool = StrictHandling.ASSUME_OK_UNEXPECTED,
    verify_integrity: bool = False,
    process_group=None,
    *,
    common_strategy=None,
):
    """Load what `sharded_state_dict` describes from `checkpoint_dir`, at this rank's layout.

    Returns the request's structure: the same keys, each ShardedTensor's tensor (loaded in
    place), each factory's merged tensor, each ShardedObject's payload, each
    LocalNonpersistentObject's object, plus the common state; or `(state_dict, missing_keys,
    unexpected_keys)` for the RETURN_* strict modes. So `model.load_state_dict(load(
    model.sharded_state_dict(), d))` works as in Megatron. Parameter order of megatron-core 0.19
    (`common_strategy` keyword-only, as in `save`).
    """
    if not isinstance(validate_access_integrity, bool):  # a 0.16-style positional call
        raise TypeError(
            f"validate_access_integrity must be a bool, got {validate_access_integrity!r}: "
            "megatron-core 0.19 removed common_strategy from the fourth position; pass it (and "
            "what follows) by keyword"
        )
    _check_strategy(sharded_strategy, "sharded_strategy")
    _check_strategy(common_strategy, "common_strategy")
    checkpoint_dir = str(checkpoint_dir)
    _verify_checkpoint(checkpoint_dir)
    if verify_integrity:
        _integrity.verify_manifest(checkpoint_dir)
    strict = parse_strict_flag(strict)
    result = load_common_state_dict(checkpoint_dir)
    sd = _copy_structure(sharded_state_dict)
    factories = _apply_factories(sd)
    tensors, objects, local = _split(sd)
    missing, unexpected = set(), set()
    if StrictHandling.requires_explicit_ckpt_mismatch_check(strict):
        tensors, objects, missing, unexpected = _strict_filter(
            tensors, objects, checkpoint_dir, strict, process_group
        )
    if validate_access_integrity:
        _, global_md = gather_compact_metadata(
            [t for _, t in tensors], [o for _, o in objects], process_group
        )
        validate_sharding_integrity(global_md)
    if hasattr(sharded_strategy, "apply_loading_parallelization"):  # FullyParallelLoad...
        _load_through(sharded_strategy, tensors + objects, checkpoint_dir, result)
    else:
        object_keys = sorted({o.unique_key for _, o in objects})
        loaded = torch_dist.load_sharded([t for _, t in tensors], object_keys, checkpoint_dir)
        for path, t in tensors:
            set_at_path(result, path, t.data)
        for path, o in objects:
            payload = loaded[o.unique_key]
            unwrapped = payload[0] if isinstance(payload, list) and payload else payload
            set_at_path(result, path, unwrapped)
    for path, obj in local:
        set_at_path(result, path, obj.unwrap())
    for path, fac in reversed(factories):
        set_at_path(result, path, fac.merge_fn(_get_at_path(result, path)))
    if StrictHandling.requires_returning_mismatch_keys(strict):
        return result, missing, unexpected
    return result


def _get_at_path(root: Any, path: tuple) -> Any:
    for k in path:
        root = root[k]
    return root


def _strict_filter(tensors, objects, checkpoint_dir, strict, group):
    """Apply StrictHandling: drop/log/raise on unexpected keys, optionally find missing ones.
    Keys are Megatron's: a ShardedObject counts by its key, not by its shards' unique keys."""
    md = torch_dist.read_dcp_metadata(checkpoint_dir).state_dict_metadata
    ckpt_keys = {_base_key(k) if isinstance(v, BytesStorageMetadata) else k for k, v in md.items()}
    requested = {t.key for _, t in tensors} | {o.key for _, o in objects}
    unexpected = requested - ckpt_keys
    missing: set[str] = set()
    if StrictHandling.requires_global_app_metadata(strict):
        all_requested = set().union(*torch_dist._all_gather_object(requested, group))
        missing = ckpt_keys - all_requested - {"common_state"}
    if unexpected or missing:
        raise_error = strict in (StrictHandling.RAISE_UNEXPECTED, StrictHandling.RAISE_ALL)
        if raise_error or strict in (StrictHandling.LOG_UNEXPECTED, StrictHandling.LOG_ALL):
            _report_mismatch(checkpoint_dir, missing, unexpected, raise_error)
    tensors = [(p, t) for p, t in tensors if t.key not in unexpected]
    objects = [(p, o) for p, o in objects if o.key not in unexpected]
    return tensors, objects, missing, unexpected


def _base_key(unique_key: str) -> str:
    """'ObjB/shard_0.3_1.8' -> 'ObjB' (ShardedObject.unique_key is key/shard_offsets_shape)."""
    return re.sub(r"/shard_[\d.]*_[\d.]*$", "", unique_key)


def _report_mismatch(checkpoint_dir, missing: set, unexpected: set, raise_error: bool) -> None:
    """Megatron's wording ("Missing keys (for all ranks)", "Unexpected keys (for this rank)"),
    only the non-empty sets, after the directory."""
    parts = []
    if missing:
        parts.append(f"Missing keys (for all ranks), in the checkpoint but not requested: "
                     f"{sorted(missing)}")  # fmt: skip
    if unexpected:
        parts.append(f"Unexpected keys (for this rank), requested but not in the checkpoint: "
                     f"{sorted(unexpected)}")  # fmt: skip
    message = f"{checkpoint_dir}: " + "; ".join(parts)
    if raise_error:
        raise CheckpointingException(message)
    logger.warning("checkpoint mismatch: %s", message)


def load_common_state_dict(checkpoint_dir: str | Path) -> StateDict:
    """The non-sharded part: `common.pt`, or the `common_state` object of newer checkpoints."""
    checkpoint_dir = str(checkpoint_dir)
    _verify_checkpoint(checkpoint_dir)
    path = os.path.join(checkpoint_dir, COMMON_STATE_FNAME)
    if os.path.exists(path):
        try:  # a regular file within the common.pt limit (never a FIFO or a device)
            f = open_regular_file(path, what="common state", max_bytes="common_pt")
        except UntrustedFileError as e:
            raise DamagedCheckpointError(str(e)) from None
        with f:
            return safe_torch_load(f, what=path)
    keys = [
        k
        for k in torch_dist.read_dcp_metadata(checkpoint_dir).state_dict_metadata
        if k.startswith("common_state/") or k == "common_state"
    ]
    if not keys:
        raise CheckpointingException(
            f"{checkpoint_dir}: no {COMMON_STATE_FNAME} and no common_state"
        )
    payload = torch_dist.load_sharded([], keys[:1], checkpoint_dir)[keys[0]]
    return payload[0] if isinstance(payload, list) else payload


def _load_through(strategy, leaves: list, checkpoint_dir: str, result: dict) -> None:
    """Load the sharded `leaves` ((path, ShardedTensor | ShardedObject)) with a strategy
    object's `load` (which returns the request's structure) into `result`."""
    request: dict = {}
    for path, leaf in leaves:
        set_at_path(request, path, leaf)
    loaded = strategy.load(request, checkpoint_dir)
    for path, _ in leaves:
        set_at_path(result, path, _get_at_path(loaded, path))


def load_tensors_metadata(checkpoint_dir: str, sharded_strategy=None) -> dict[str, ShardedTensor]:
    """{key: ShardedTensor without data} with each stored tensor's global shape and dtype."""
    _check_strategy(sharded_strategy, "sharded_strategy")
    _verify_checkpoint(str(checkpoint_dir))
    return torch_dist.TorchDistLoadShardedStrategy().load_tensors_metadata(checkpoint_dir)


def load_sharded_metadata(checkpoint_dir: str, sharded_strategy=None, common_strategy=None) -> dict:
    """Like `load_tensors_metadata`, plus ShardedObjects (data None) by unique key."""
    _check_strategy(sharded_strategy, "sharded_strategy")
    _verify_checkpoint(str(checkpoint_dir))
    return torch_dist.TorchDistLoadShardedStrategy().load_sharded_metadata(checkpoint_dir)


def remove_sharded_tensors(checkpoint_dir: str, key_prefix: str) -> None:
    """Remove every entry whose key starts with `key_prefix` from a saved checkpoint (run it
    on one rank; see `TorchDistLoadShardedStrategy.remove_sharded_tensors`)."""
    _verify_checkpoint(str(checkpoint_dir))
    torch_dist.TorchDistLoadShardedStrategy().remove_sharded_tensors(checkpoint_dir, key_prefix)


def load_plain_tensors(checkpoint_dir: str) -> StateDict:
    """Every stored tensor, whole, by key (no common state, no validation)."""
    request = load_tensors_metadata(checkpoint_dir)
    loaded = torch_dist.load_sharded(list(request.values()), [], checkpoint_dir)
    del loaded
    return {k: v.data for k, v in request.items()}


def load_content_metadata(checkpoint_dir: str | None = None, *, preloaded_state_dict=None):
    """The `content_metadata` given to `save`, or None."""
    if preloaded_state_dict is None:
        if checkpoint_dir is None:
            raise ValueError("load_content_metadata needs checkpoint_dir or preloaded_state_dict")
        preloaded_state_dict = load_common_state_dict(checkpoint_dir)
    return preloaded_state_dict.get(_CONTENT_METADATA_KEY)
