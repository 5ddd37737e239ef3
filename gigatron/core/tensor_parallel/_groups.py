"""Process-group plumbing shared by the tensor_parallel modules.

The public, Megatron-style entry points accept `group=None` / `tp_group=None` and resolve it here,
once, to `parallel_state`'s tensor-parallel group (or the expert tensor-parallel group for expert
layers). Everything below the public edge takes an explicit group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core import parallel_state


def get_tensor_model_parallel_group_if_none(group, is_expert: bool = False):
    """`group` if given, else parallel_state's TP group (expert TP group when `is_expert`)."""
    if group is not None:
        return group
    if is_expert:
        return parallel_state.get_expert_tensor_parallel_group()
    return parallel_state.get_tensor_model_parallel_group()


def group_size(group) -> int:
    """Number of ranks in `group` (1 when torch.distributed is not initialised)."""
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def group_rank(group) -> int:
    """This process's rank inside `group` (0 when torch.distributed is not initialised)."""
    if not dist.is_initialized():
        return 0
    return dist.get_rank(group=group)


def group_src_rank(group) -> int:
    """Global rank of `group`'s rank 0 (the source of broadcasts inside the group)."""
    if not dist.is_initialized():
        return 0
    return dist.get_global_rank(group, 0) if group is not None else 0


def default_device() -> torch.device:
    """Where activations live: the current CUDA device if there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
