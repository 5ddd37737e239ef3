"""`TorchFullyShardedDataParallelConfig`: mirrors
`megatron.core.distributed.torch_fully_sharded_data_parallel_config`."""

from __future__ import annotations

from dataclasses import dataclass

from gigatron.core.distributed.distributed_data_parallel_config import (
    DistributedDataParallelConfig,
)


@dataclass
class TorchFullyShardedDataParallelConfig(DistributedDataParallelConfig):
    """Configuration for TorchFullyShardedDataParallel."""

    reshard_after_forward: bool | int = True
    """FSDP2's option: free each unit's gathered params after its forward (True), keep them
    for backward (False), or reshard to a smaller group of that many ranks (int)."""
