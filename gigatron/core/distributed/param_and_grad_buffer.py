"""Contiguous parameter and gradient buffers split into buckets; mirrors
`megatron.core.distributed.param_and_grad_buffer`.

One `_ParamAndGradBuffer` per (param dtype, grad dtype). Params are laid out in reverse
registration order (roughly the order backward produces their grads), and cut into buckets of
at least `bucket_size` elements. Every param gets `param.main_grad`, a view of its slice of
the flat grad buffer. With the distributed optimizer the params' storage also moves into a flat
param buffer (so a DP rank can all-gather whole buckets), each param starts 64-element aligned
and each bucket is padded to a multiple of lcm(dp, 128) so it splits into dp equal shards:

    bucket:  [ shard 0 | shard 1 | ... | shard dp-1 ]   rank r owns shard r

A `_ParamAndGradBucketGroup` (here: one bucket) runs that bucket's collectives: grad
all-reduce or reduce-scatter (async when `overlap_grad_reduce`, launched by the last param's
backward hook in the last microbatch) and the param all-gather after the optimizer step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core._buffer_layout import (  # noqa: F401  (Megatron's names here)
    _compute_default_per_buffer_param_layout,
    _param_uses_quantized_storage,
    group_params_for_buffers,
    padded_param_layout,
)
from gigatron.core.distributed.distributed_data_parallel_config import (
    DistributedDataParallelConfig,
)
from gigatron.core.fp8_utils import is_float8tensor, is_nvfp4tensor  # noqa: F401
from gigatron.core.utils import all_gather_into, reduce_scatter_into

# The reduce-scatter the grad sync calls, looked up at call time (Megatron's tests patch it).
dist_reduce_scatter_func = reduce_scatter_into


def _group_size(group) -> int:
    if group is not None and hasattr(group, "size"):
        return group.size()
    return dist.get_world_size(group) if dist.is_initialized() else 1


def shard_buffer(buffer: torch.Tensor, data_parallel_world_size: int) -> list[torch.Tensor]:
    """Split a 1-D buffer into `data_parallel_world_size` equal views."""
    assert buffer.numel() % data_parallel_world_size == 0
    size = buffer.numel() // data_parallel_world_size
    return [buffer[r * size : (r + 1) * size] for r in range(data_parallel_world_size)]


class _ParamAndGradBucket:
    """A slice of a buffer: `params`, their `param_data` / `grad_data` views, and where each
    param sits inside the bucket (`param_to_index[param] = (start, end)`)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        param_data: torch.Tensor | None,
        grad_data: torch.Tensor,
        offset: int,
        numel_unpadded: int,
        gradient_scaling_factor: float,
        bucket_id: int,
        param_index_map: dict,
    ):
        self.params_list = params
        self.params = set(params)
        self.param_data = param_data
        self.grad_data = grad_data
        self.offset = offset  # start of this bucket inside the buffer
        self.numel_unpadded = numel_unpadded
        self.gradient_scaling_factor = gradient_scaling_factor
        self.bucket_id = bucket_id
        self.param_to_index = {
            p: (param_index_map[p][0] - offset, param_index_map[p][1] - offset) for p in params
        }


class _ParamAndGradBucketGroup:
    """Collectives of a set of buckets (gigatron: exactly one), with bucket-ready tracking."""

    def __init__(
        self,
        buckets: list[_ParamAndGradBucket],
        ddp_config: DistributedDataParallelConfig,
        collective_group,
        collective_group_size: int,
    ):
        self.buckets = buckets
        self.ddp_config = ddp_config
        self.data_parallel_group = collective_group
        self.intra_distributed_optimizer_instance_group = collective_group
        self.intra_distributed_optimizer_instance_size = collective_group_size
        self.intra_distributed_optimizer_instance_rank = (
            dist.get_rank(collective_group) if collective_group_size > 1 else 0
        )
        self.params = set().union(*(b.params for b in buckets))
        self.param_to_bucket = {p: b for b in buckets for p in b.params}
        self.next_param_gather_bucket_group: _ParamAndGradBucketGroup | None = None
        self.is_last_microbatch = True
        # Times each param's grad arrived in the last microbatch (more than once for a param
        # used twice); learned in the first batch, compared against in every later one.
        self.per_param_grad_ready_counts: dict = {}
        self.golden_per_param_grad_ready_counts: dict = {}
        self.is_first_batch = True
        self.reset()
        self.param_gather_handle = None
        self.param_gather_dispatched = False

    def reset(self) -> None:
        """Start a new iteration (called by zero_grad_buffer). At the end of the first batch
        the grads that arrived become the expected ones (`golden_per_param_grad_ready_counts`):
        from then on the bucket launches when exactly those have arrived. A collective still
        in flight is completed first: every rank launched it, and dropping it would leave it
        writing into the buffer of the next iteration."""
        if getattr(self, "grad_reduce_handle", None) is not None:
            self._wait_grad_reduce()
        if self.is_first_batch and self.per_param_grad_ready_counts:
            # Megatron asserts every param reported; gigatron accepts params that never produce
            # a grad (unused): they are left out of the expected set (docs/distributed.md).
            self.golden_per_param_grad_ready_counts = self.per_param_grad_ready_counts
            self.is_first_batch = False
        self.per_param_grad_ready_counts: dict = {}
        self.is_last_microbatch = True
        self.grad_reduce_handle = None
        self._pending_copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    # ---- grads ---------------------------------------------------------------------------
    def check_grads(self) -> None:
        """Raise if any grad in the group is NaN/Inf (before communication)."""
        for bucket in self.buckets:
            if not torch.isfinite(bucket.grad_data).all():
                rank = dist.get_rank() if dist.is_initialized() else 0
                raise RuntimeError(
                    f"rank {rank}: found NaN or Inf in local grad buffer (bucket "
                    f"{bucket.bucket_id}) before the data-parallel collective"
                )

    def start_grad_sync(self, force_all_reduce: bool = False) -> None:
        """Scale and launch the all-reduce (or reduce-scatter into this rank's shard)."""
        assert self.grad_reduce_handle is None, "grad collective already outstanding"
        if self.ddp_config.check_for_nan_in_grad:
            self.check_grads()
        for bucket in self.buckets:
            if bucket.gradient_scaling_factor != 1.0:
                bucket.grad_data.mul_(bucket.gradient_scaling_factor)
        op = dist.ReduceOp.AVG if self.ddp_config.average_in_collective else dist.ReduceOp.SUM
        async_op = self.ddp_config.overlap_grad_reduce
        group, size = self.data_parallel_group, self.intra_distributed_optimizer_instance_size
        handles = []
        for bucket in self.buckets:
            if size == 1 and not dist.is_initialized():
                continue  # no process group: sum or average over one rank is the identity
            if self.ddp_config.use_distributed_optimizer and not force_all_reduce:
                # Reduce-scatter into a fresh tensor: the output may not alias the input on every
                # backend. The shard is copied into grad_data once the collective completed.
                shard = shard_buffer(bucket.grad_data, size)[
                    self.intra_distributed_optimizer_instance_rank
                ]
                out = torch.empty_like(shard)
                handles.append(
                    dist_reduce_scatter_func(
                        out, bucket.grad_data, op=op, group=group, async_op=async_op
                    )
                )
                self._pending_copies.append((shard, out))
            else:
                handles.append(
                    dist.all_reduce(bucket.grad_data, op=op, group=group, async_op=async_op)
                )
        if async_op:
            self.grad_reduce_handle = handles
        else:
            self._finish_copies()

    def _finish_copies(self) -> None:
        for shard, out in self._pending_copies:
            shard.copy_(out)
        self._pending_copies = []

    def _wait_grad_reduce(self) -> None:
        for handle in self.grad_reduce_handle or []:
            if handle is not None:
                handle.wait()
        self._finish_copies()
        self.grad_reduce_handle = None

    def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
        """Wait for this group's grad collective (without overlap: run it now).

        With `overlap_grad_reduce` the collective is launched by the last expected grad's
        hook; only in the first batch (which learns which grads to expect) does this launch
        it. After that, calling it before the expected grads arrived raises AssertionError on
        every rank that got here early, as Megatron does, so no rank waits alone in a
        collective the others never start."""
        self.param_gather_dispatched = False
        if not self.ddp_config.overlap_grad_reduce:
            self.start_grad_sync(force_all_reduce=force_all_reduce)
            return
        if self.grad_reduce_handle is None:
            if not self.is_first_batch:
                raise AssertionError(
                    f"grad collective of bucket {self.buckets[0].bucket_id} was not launched: "
                    f"{len(self.per_param_grad_ready_counts)}/{len(self.params)} params "
                    f"reported their grad ({len(self.golden_per_param_grad_ready_counts)} "
                    "expected, as in the first batch); finish_grad_sync must follow the last "
                    "microbatch's backward"
                )
            self.start_grad_sync(force_all_reduce=force_all_reduce)
        self._wait_grad_reduce()

    def register_grad_ready(self, param: torch.nn.Parameter, force_all_reduce: bool = False):
        """Called by a param's backward hook in the last microbatch: count the grad, and once
        the group's grads match the first batch's (after it), launch the collective."""
        assert self.ddp_config.overlap_grad_reduce, (
            "register_grad_ready() is only called with overlap_grad_reduce=True"
        )
        if not self.is_last_microbatch:
            return
        if self.grad_reduce_handle is not None and not self.is_first_batch:
            raise RuntimeError(
                "a bucket's grads were already reduced in this iteration: run all but the last "
                "microbatch inside ddp_model.no_sync() and call zero_grad_buffer() per iteration"
            )
        assert param in self.params, "register_grad_ready: param is not in this bucket group"
        counts = self.per_param_grad_ready_counts
        counts[param] = counts.get(param, 0) + 1
        if not self.is_first_batch and counts == self.golden_per_param_grad_ready_counts:
            self.start_grad_sync(force_all_reduce=force_all_reduce)

    # ---- params (distributed optimizer) ----------------------------------------------------
    def start_param_sync(self, force_sync: bool = False) -> None:
        """All-gather every DP rank's updated param shard into the full bucket (async with
        overlap_param_gather unless `force_sync`; `force_sync` also completes a pending one)."""
        assert self.ddp_config.use_distributed_optimizer
        if force_sync and self.param_gather_handle is not None:
            self._wait_param_gather()
            return
        assert self.param_gather_handle is None, "param all-gather already outstanding"
        size = self.intra_distributed_optimizer_instance_size
        async_op = self.ddp_config.overlap_param_gather and not force_sync
        handles = []
        for bucket in self.buckets if size > 1 else []:
            rank = self.intra_distributed_optimizer_instance_rank
            local = shard_buffer(bucket.param_data, size)[rank].clone()  # input must not alias
            handles.append(
                all_gather_into(
                    bucket.param_data, local, group=self.data_parallel_group, async_op=async_op
                )
            )
        self.param_gather_handle = handles if async_op and handles else None
        self.param_gather_dispatched = True

    def _wait_param_gather(self) -> None:
        for handle in self.param_gather_handle:
            handle.wait()
        self.param_gather_handle = None

    def finish_param_sync(self, skip_next_bucket_dispatch: bool = False) -> None:
        """Wait for this group's all-gather (dispatching it if needed), then dispatch the next
        group's so it overlaps with this module's forward."""
        if not self.param_gather_dispatched:
            self.start_param_sync()
        if self.param_gather_handle is not None:
            self._wait_param_gather()
            nxt = self.next_param_gather_bucket_group
            if (
                nxt is not None
                and not skip_next_bucket_dispatch
                and not nxt.param_gather_dispatched
            ):
                nxt.start_param_sync()


class _ParamAndGradBuffer:
    """Flat param (distributed optimizer only) and grad storage for params of one BufferKey.

    `params_with_names`: params in registration order, or (param, name) pairs as Megatron
    passes them. `param_layout` (a `PerBufferParamLayout`): where each param goes; None
    computes the distributed optimizer's padded layout with `use_distributed_optimizer`, else
    the packed one.
    """

    def __init__(
        self,
        ddp_config: DistributedDataParallelConfig,
        param_dtype: torch.dtype,
        grad_dtype: torch.dtype,
        params_with_names: list,
        data_parallel_group,
        bucket_size: int | None,
        param_to_name: dict,
        gradient_scaling_factor: float,
        param_indices: list[int] | None = None,
        nccl_ub: bool = False,
        pg_collection=None,
        param_layout=None,
    ):
        params = [p[0] if isinstance(p, tuple) else p for p in params_with_names]
        if len(set(params)) != len(params):
            raise ValueError("_ParamAndGradBuffer: a param is listed twice")
        self.ddp_config = ddp_config
        self.params = params
        self.param_dtype = param_dtype
        self.grad_dtype = grad_dtype
        self.data_parallel_group = data_parallel_group
        self.data_parallel_world_size = _group_size(data_parallel_group)
        self.gradient_scaling_factor = gradient_scaling_factor
        self.param_to_name = param_to_name
        self.param_indices = list(param_indices) if param_indices is not None else []
        self.nccl_ub = nccl_ub
        if param_layout is None:
            if ddp_config.use_distributed_optimizer:
                param_layout = padded_param_layout(
                    params, bucket_size, self.data_parallel_world_size, ddp_config
                )
            else:
                param_layout = _compute_default_per_buffer_param_layout(params, bucket_size)
        if set(param_layout.param_index_map) != set(params):
            raise ValueError(
                f"_ParamAndGradBuffer: param_layout places {len(param_layout.param_index_map)} "
                f"params but the buffer holds {len(params)}; the layout must cover exactly them"
            )
        self.param_index_map: dict = param_layout.param_index_map  # param -> (start, end, id)
        self.bucket_indices: list[tuple[int, int]] = list(param_layout.bucket_indices)
        per_bucket_unpadded = list(param_layout.per_bucket_numel_unpadded)
        self.numel = self.bucket_indices[-1][1] if self.bucket_indices else 0
        self.numel_unpadded = sum(per_bucket_unpadded)
        device = params[0].device
        self.grad_data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        self.param_data = None
        if ddp_config.use_distributed_optimizer:
            self.param_data = torch.zeros(self.numel, dtype=param_dtype, device=device)
        with torch.no_grad():
            for param in params:
                start, end, _ = self.param_index_map[param]
                if self.param_data is not None:
                    # Move the param's storage into the flat buffer (its values are kept).
                    view = self.param_data[start:end].view(param.shape)
                    view.copy_(param.data)
                    param.data = view
                param.main_grad = self.grad_data[start:end].view(param.shape)
        self.buckets: list[_ParamAndGradBucket] = []
        self.param_to_bucket: dict = {}
        for bucket_id, (start, end) in enumerate(self.bucket_indices):
            bucket_params = [p for p in params if self.param_index_map[p][2] == bucket_id]
            bucket = _ParamAndGradBucket(
                params=bucket_params,
                param_data=None if self.param_data is None else self.param_data[start:end],
                grad_data=self.grad_data[start:end],
                offset=start,
                numel_unpadded=per_bucket_unpadded[bucket_id],
                gradient_scaling_factor=gradient_scaling_factor,
                bucket_id=bucket_id,
                param_index_map=self.param_index_map,
            )
            self.buckets.append(bucket)
            for p in bucket_params:
                self.param_to_bucket[p] = bucket

    def scale_gradients(self, scaling_factor: float) -> None:
        """Multiply the whole grad buffer by `scaling_factor`."""
        self.grad_data.mul_(scaling_factor)

    def reset(self) -> None:
        """Zero the grad buffer."""
        self.grad_data.zero_()


def partition_buckets(
    buffers: list[_ParamAndGradBuffer], ddp_config: DistributedDataParallelConfig
) -> list[_ParamAndGradBucketGroup]:
    """One bucket group per bucket, in buffer order."""
    groups = []
    for buffer in buffers:
        size = buffer.data_parallel_world_size
        for bucket in buffer.buckets:
            groups.append(
                _ParamAndGradBucketGroup([bucket], ddp_config, buffer.data_parallel_group, size)
            )
    return groups
