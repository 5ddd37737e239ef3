"""Param layouts of DDP's flat buffers: which buffer a param goes to and where in it.

Params are laid out in reverse registration order (roughly the order backward produces their
grads) and cut into buckets of at least `bucket_size` elements. Two flavours:

- packed (`_compute_default_per_buffer_param_layout`, no distributed optimizer): back to back;
- padded (`padded_param_layout`, the distributed optimizer's): each param starts 64-element
  aligned, each bucket ends padded to lcm(dp, 128) (x 2**16 with pad_buckets_for_high_nccl_busbw)
  so it splits into dp equal shards, and a `shared_embedding` param gets a bucket of its own (the
  first and last pipeline stage then shard the tied embedding identically).
"""

from __future__ import annotations

import torch

from gigatron.core._param_layout import (
    BufferKey,
    PerBufferParamLayout,
    pad_bucket_end,
    pad_param_start,
)
from gigatron.core.fp8_utils import is_float8tensor, is_nvfp4tensor


def _param_uses_quantized_storage(param: torch.nn.Parameter) -> bool:
    """True for params whose storage is a quantized tensor (never in gigatron: its FP8 linears
    keep high-precision params, as Megatron's params are without Transformer Engine)."""
    return is_float8tensor(param) or is_nvfp4tensor(param)


def group_params_for_buffers(
    params: list[torch.nn.Parameter], grad_reduce_in_fp32: bool
) -> dict[BufferKey, tuple[list[torch.nn.Parameter], list[int]]]:
    """BufferKey -> (params in registration order, each param's index among params of the same
    logical dtype / grad dtype / expert flag). Every param must require grad."""
    groups: dict[BufferKey, tuple[list, list]] = {}
    counts: dict[BufferKey, int] = {}
    for param in params:
        if not param.requires_grad:
            raise ValueError(
                f"group_params_for_buffers: a param of shape {tuple(param.shape)} does not "
                "require grad; DDP buffers hold trainable params only"
            )
        grad_dtype = torch.float32 if grad_reduce_in_fp32 else param.dtype
        expert = not getattr(param, "allreduce", True)
        layer_wise = getattr(param, "is_managed_by_layer_wise_optimizer", False)
        storage = torch.uint8 if _param_uses_quantized_storage(param) else param.dtype
        key = BufferKey(storage, grad_dtype, expert, layer_wise)
        # Quantized params count among their logical dtype, so a checkpoint saved without FP8
        # storage maps onto the same indices.
        logical = BufferKey(param.dtype, grad_dtype, expert, layer_wise)
        members, indices = groups.setdefault(key, ([], []))
        members.append(param)
        indices.append(counts.get(logical, 0))
        counts[logical] = counts.get(logical, 0) + 1
    return groups


def _compute_default_per_buffer_param_layout(
    params: list[torch.nn.Parameter], bucket_size: int | None
) -> PerBufferParamLayout:
    """Packed layout: no padding, buckets closed once they reach `bucket_size` elements
    (None: one bucket)."""
    layout = PerBufferParamLayout()
    start = bucket_start = 0
    bucket_id = 0
    open_bucket = False
    for param in params[::-1]:
        end = start + param.numel()
        layout.param_index_map[param] = (start, end, bucket_id)
        open_bucket = True
        if bucket_size is not None and end - bucket_start >= bucket_size:
            layout.per_bucket_numel_unpadded.append(end - bucket_start)
            layout.bucket_indices.append((bucket_start, end))
            bucket_start, bucket_id, open_bucket = end, bucket_id + 1, False
        start = end
    if open_bucket:
        layout.per_bucket_numel_unpadded.append(start - bucket_start)
        layout.bucket_indices.append((bucket_start, start))
    return layout


def padded_param_layout(
    params: list[torch.nn.Parameter],
    bucket_size: int | None,
    data_parallel_world_size: int,
    ddp_config,
    param_indices: list[int] | None = None,
) -> PerBufferParamLayout:
    """The distributed optimizer's layout (see module doc): every bucket splits into
    `data_parallel_world_size` equal shards."""
    layout = PerBufferParamLayout(
        param_indices=list(param_indices) if param_indices is not None else [],
        num_optimizer_shards=data_parallel_world_size,
    )
    high_busbw = ddp_config.pad_buckets_for_high_nccl_busbw
    state = {"bucket_start": 0, "bucket_id": 0, "in_bucket": 0}

    def close_bucket(last_end: int) -> int:
        layout.per_bucket_numel_unpadded.append(last_end - state["bucket_start"])
        bucket_end = pad_bucket_end(last_end, data_parallel_world_size, high_busbw)
        layout.bucket_indices.append((state["bucket_start"], bucket_end))
        state.update(bucket_start=bucket_end, bucket_id=state["bucket_id"] + 1, in_bucket=0)
        return bucket_end

    start = end = 0
    for param in params[::-1]:
        own_bucket = getattr(param, "shared_embedding", False)
        start = pad_param_start(start)
        if own_bucket and state["in_bucket"]:
            start = close_bucket(start)
        end = start + param.numel()
        layout.param_index_map[param] = (start, end, state["bucket_id"])
        state["in_bucket"] += 1
        full = bucket_size is not None and end - state["bucket_start"] >= bucket_size
        start = close_bucket(end) if (full or own_bucket) else end
    if state["in_bucket"]:
        close_bucket(end)
    return layout
