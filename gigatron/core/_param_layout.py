"""Where each param sits in DDP's flat buffers; Megatron's `megatron.core.optimizer.param_layout`
(re-exported there; here so `core.distributed` and `core.optimizer` both build on it).

A layout is computed before DDP allocates anything, by whoever decides the padding: the
distributed optimizer (`DistributedOptimizer.compute_full_param_layout`: 64-element aligned
param starts, bucket ends padded to lcm(dp, 128) so each bucket splits into dp equal shards)
or DDP itself without it (`param_and_grad_buffer._compute_default_per_buffer_param_layout`:
params packed back to back). DDP then builds one buffer per `BufferKey` from its layout.

    buffer: [ bucket 0: p_n .. p_k | pad ][ bucket 1: p_k-1 .. p_0 | pad ]   (reverse order)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

PARAM_START_ALIGNMENT = 64  # elements


def pad_to_divisor(value: int, divisor: int) -> int:
    """The smallest multiple of `divisor` that is >= `value`."""
    return -(-value // divisor) * divisor


def pad_param_start(param_start_index: int) -> int:
    """A param's start, rounded up to a multiple of 64 elements."""
    return pad_to_divisor(param_start_index, PARAM_START_ALIGNMENT)


def bucket_end_divisor(data_parallel_world_size: int, pad_for_high_nccl_busbw: bool) -> int:
    """What a bucket's padded length is a multiple of: lcm(dp, 128), and 2**16 with
    `pad_for_high_nccl_busbw` (large even messages run at full NCCL bus bandwidth)."""
    divisor = math.lcm(data_parallel_world_size, 128)
    return math.lcm(divisor, 2**16) if pad_for_high_nccl_busbw else divisor


def pad_bucket_end(
    bucket_end_index: int, data_parallel_world_size: int, pad_for_high_nccl_busbw: bool
) -> int:
    """A bucket's end, padded so the bucket splits into `data_parallel_world_size` shards."""
    divisor = bucket_end_divisor(data_parallel_world_size, pad_for_high_nccl_busbw)
    return pad_to_divisor(bucket_end_index, divisor)


@dataclass(frozen=True)
class BufferKey:
    """One DDP buffer: params sharing storage dtype, grad dtype, DP group (expert or dense)
    and optimizer flavour live in the same flat buffer."""

    param_dtype: torch.dtype
    """Storage dtype of the params (torch.uint8 for quantized storage)."""
    grad_dtype: torch.dtype
    """dtype of the grad buffer (fp32 with grad_reduce_in_fp32)."""
    is_expert_parallel: bool
    """True for params with `allreduce = False`: reduced over the expert-DP group."""
    is_managed_by_layer_wise_optimizer: bool = False
    """True for params a layer-wise optimizer shards whole (never split across ranks)."""


@dataclass
class PerBufferParamLayout:
    """Layout of one buffer."""

    param_index_map: dict = field(default_factory=dict)
    """param -> (start, end, bucket_id) inside the buffer."""
    bucket_indices: list = field(default_factory=list)
    """(start, end) of each bucket, padding included."""
    per_bucket_numel_unpadded: list = field(default_factory=list)
    """Elements of each bucket from its first param's start to its last param's end."""
    param_indices: list = field(default_factory=list)
    """Each param's index among params of its dtype (checkpoint compatibility)."""
    num_optimizer_shards: int | None = None
    """DP shards the distributed optimizer splits each bucket into; None without it."""


@dataclass
class FullParamLayout:
    """Layouts of all buffers of a model chunk, one independent index space per buffer."""

    layouts: dict = field(default_factory=dict)
    """BufferKey -> PerBufferParamLayout."""
