"""Tensor-parallel parameter attributes and weight initialisation (re-exported by `layers`).

Mirrors the helpers at the top of `megatron.core.tensor_parallel.layers`. A partitioned parameter
carries `tensor_model_parallel=True`, `partition_dim` (the split dim) and `partition_stride`;
optimizers, grad-norm and checkpointing read these.
"""

from __future__ import annotations

import torch

from gigatron.core.utils import divide, get_tensor_model_parallel_group_if_none

_MODEL_PARALLEL_ATTRIBUTE_DEFAULTS = {
    "tensor_model_parallel": False,
    "partition_dim": -1,
    "partition_stride": 1,
}


def param_is_not_tensor_parallel_duplicate(param, tp_group=None, expert_tp_group=None) -> bool:
    """True if `param` is TP-partitioned, or this is rank 0 of the group that replicates it.

    Expert parameters (`allreduce=False`) are judged against `expert_tp_group` when given.
    Used to count replicated parameters once (grad norm, parameter counts).
    """
    if getattr(param, "tensor_model_parallel", False):
        return True
    if expert_tp_group is not None and not getattr(param, "allreduce", True):
        return expert_tp_group.rank() == 0
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    return torch.distributed.get_rank(group=tp_group) == 0


def set_tensor_model_parallel_attributes(tensor, is_parallel: bool, dim: int, stride: int) -> None:
    """Mark `tensor` as split along `dim` (with `stride`) over TP; the attributes must be unset."""
    for attribute in _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS:
        if hasattr(tensor, attribute):
            raise ValueError(
                f"set_tensor_model_parallel_attributes: tensor already has attribute "
                f"{attribute!r} (= {getattr(tensor, attribute)!r}); attributes are set once"
            )
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


def set_defaults_if_not_set_tensor_model_parallel_attributes(tensor) -> None:
    """Give `tensor` the not-partitioned defaults for any TP attribute it lacks."""
    for attribute, value in _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS.items():
        if not hasattr(tensor, attribute):
            setattr(tensor, attribute, value)


def copy_tensor_model_parallel_attributes(destination_tensor, source_tensor) -> None:
    """Copy whichever TP attributes `source_tensor` has onto `destination_tensor`."""
    for attribute in _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS:
        if hasattr(source_tensor, attribute):
            setattr(destination_tensor, attribute, getattr(source_tensor, attribute))


def _initialize_affine_weight_gpu(weight, init_method, partition_dim, stride=1, is_expert=False):
    """Initialise this rank's shard directly, on a forked tracker stream (not TP-invariant)."""
    from gigatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        get_expert_parallel_rng_tracker_name,
    )

    name = get_expert_parallel_rng_tracker_name() if is_expert else "model-parallel-rng"
    with get_cuda_rng_tracker().fork(name):
        init_method(weight)


def _initialize_affine_weight_cpu(
    weight,
    output_size,
    input_size,
    per_partition_size,
    partition_dim,
    init_method,
    stride=1,
    return_master_weight=False,
    *,
    params_dtype=torch.float32,
    rank=None,
    world_size=None,
):
    """Build the full `[output_size, input_size]` weight in fp32 and copy this rank's chunks.

    The full weight is cut into `per_partition_size / stride` slices along `partition_dim`;
    rank r keeps slices r, r + tp, r + 2tp, ... so every TP size sees the same full weight
    (given the same CPU RNG state).
    """
    master_weight = torch.empty(output_size, input_size, dtype=torch.float, requires_grad=False)
    init_method(master_weight)
    master_weight = master_weight.to(dtype=params_dtype)
    per_stride = divide(per_partition_size, stride)
    slices = torch.split(master_weight, per_stride, dim=partition_dim)
    with torch.no_grad():
        weight.data.copy_(torch.cat(slices[rank::world_size], dim=partition_dim))
    return master_weight if return_master_weight else None
