"""Data parallelism: `megatron.core.distributed` (DDP with contiguous grad buffers,
finalize_model_grads)."""

from gigatron.core.distributed.distributed_data_parallel import DistributedDataParallel
from gigatron.core.distributed.distributed_data_parallel_config import (
    DistributedDataParallelConfig,
)
from gigatron.core.distributed.finalize_model_grads import finalize_model_grads
from gigatron.core.distributed.param_and_grad_buffer import partition_buckets

__all__ = [
    "DistributedDataParallel",
    "DistributedDataParallelConfig",
    "finalize_model_grads",
    "partition_buckets",
]
