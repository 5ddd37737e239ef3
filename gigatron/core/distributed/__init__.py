"""Data parallelism: `megatron.core.distributed` (DDP with contiguous grad buffers,
finalize_model_grads; fully sharded data parallel on FSDP2)."""

from gigatron.core.distributed.distributed_data_parallel import DistributedDataParallel
from gigatron.core.distributed.distributed_data_parallel_config import (
    DistributedDataParallelConfig,
)
from gigatron.core.distributed.finalize_model_grads import finalize_model_grads
from gigatron.core.distributed.fsdp import FullyShardedDataParallel
from gigatron.core.distributed.param_and_grad_buffer import partition_buckets
from gigatron.core.distributed.torch_fully_sharded_data_parallel import (
    TorchFullyShardedDataParallel,
)
from gigatron.core.distributed.torch_fully_sharded_data_parallel_config import (
    TorchFullyShardedDataParallelConfig,
)

__all__ = [
    "DistributedDataParallel",
    "DistributedDataParallelConfig",
    "FullyShardedDataParallel",
    "TorchFullyShardedDataParallel",
    "TorchFullyShardedDataParallelConfig",
    "finalize_model_grads",
    "partition_buckets",
]
