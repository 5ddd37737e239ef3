"""Megatron-FSDP's names (`megatron.core.distributed.fsdp`) on PyTorch's FSDP2."""

from gigatron.core.distributed.fsdp.mcore_fsdp_adapter import (
    FullyShardedDataParallel,
    FullyShardedDataParallelV1,
    FullyShardedDataParallelV2,
)

__all__ = ["FullyShardedDataParallel", "FullyShardedDataParallelV1", "FullyShardedDataParallelV2"]
