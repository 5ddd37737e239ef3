"""Move full (TP = 1) weights into a tensor-parallel model and back to full shards.

A TP-split parameter carries Megatron's attributes `tensor_model_parallel`, `partition_dim` and
`partition_stride`. The full tensor is cut into tp * stride equal slices along `partition_dim`;
rank r holds slices r, r + tp, ... (the rule of Megatron's CPU initialisation), which for the GLU
fc1 weight (stride 2) gives each rank [gate_r; up_r] of the global [all gate; all up]. Everything
else is replicated over TP. gigatron-specific helpers (used by tests and the HF converter).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core import parallel_state


def tp_split_of(param: Tensor) -> tuple[int, int] | None:
    """(partition_dim, stride) of a TP-split parameter, None for a TP-replicated one."""
    if not getattr(param, "tensor_model_parallel", False):
        return None
    return param.partition_dim, getattr(param, "partition_stride", 1)


def shard_for_rank(full: Tensor, param: Tensor, tp_rank: int, tp_size: int) -> Tensor:
    """This rank's piece of `full` for the TP layout of `param` (a view of `full`)."""
    split = tp_split_of(param)
    if split is None or tp_size == 1:
        return full
    dim, stride = split
    slices = torch.chunk(full, tp_size * stride, dim=dim)
    return torch.cat(slices[tp_rank::tp_size], dim=dim)


def load_full_state_dict(model: torch.nn.Module, full_sd: dict[str, Tensor]) -> None:
    """Copy this TP rank's shard of every full tensor in `full_sd` into `model` (strict)."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(full_sd))
    unexpected = sorted(set(full_sd) - set(params))
    if missing or unexpected:
        raise ValueError(f"load_full_state_dict: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, param in params.items():
            shard = shard_for_rank(full_sd[name], param, tp_rank, tp_size)
            if shard.shape != param.shape:
                raise ValueError(
                    f"load_full_state_dict: {name} shard {tuple(shard.shape)} does not match "
                    f"parameter {tuple(param.shape)} (full {tuple(full_sd[name].shape)})"
                )
            param.copy_(shard)
