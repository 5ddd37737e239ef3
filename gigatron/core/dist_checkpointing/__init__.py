"""Distributed checkpointing: save and load sharded state dicts, reshardable across layouts.

Mirrors `megatron.core.dist_checkpointing`; writes and reads Megatron's `torch_dist` format.
"""

from gigatron.core.dist_checkpointing._safe_load import add_safe_globals
from gigatron.core.dist_checkpointing.core import (
    CheckpointingException,
    DamagedCheckpointError,
    check_is_distributed_checkpoint,
)
from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedObject,
    ShardedTensor,
    ShardedTensorFactory,
)
from gigatron.core.dist_checkpointing.serialization import (
    load,
    load_common_state_dict,
    load_content_metadata,
    load_plain_tensors,
    load_sharded_metadata,
    load_tensors_metadata,
    remove_sharded_tensors,
    save,
)
from gigatron.core.dist_checkpointing.validation import StrictHandling

__all__ = [
    "CheckpointingException",
    "DamagedCheckpointError",
    "LocalNonpersistentObject",
    "ShardedObject",
    "ShardedTensor",
    "ShardedTensorFactory",
    "StrictHandling",
    "add_safe_globals",
    "check_is_distributed_checkpoint",
    "load",
    "load_common_state_dict",
    "load_content_metadata",
    "load_plain_tensors",
    "load_sharded_metadata",
    "load_tensors_metadata",
    "remove_sharded_tensors",
    "save",
]
