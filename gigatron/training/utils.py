"""Rank-aware printing and small helpers of `megatron.training.utils`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps


def is_last_rank() -> bool:
    return not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1


def print_rank_0(message) -> None:
    """Print on global rank 0 only (or always, without torch.distributed)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def print_rank_last(message) -> None:
    """Print on the last global rank (where the loss lives under pipelining)."""
    if is_last_rank():
        print(message, flush=True)


def average_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """Mean of each loss over the data-parallel group."""

    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    dist.all_reduce(averaged, group=ps.get_data_parallel_group())
    return averaged / dist.get_world_size(group=ps.get_data_parallel_group())


# the flags `parallel_state.initialize_model_parallel` takes under the same names
PARALLEL_SIZE_FLAGS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def args_by_name(args, names) -> dict:
    """{name: args.name} for each of `names` (a tuple, or one space-separated string): the flags
    a callee takes under the flags' own names, passed as `**args_by_name(args, ...)`."""
    if isinstance(names, str):
        names = names.split()
    return {name: getattr(args, name) for name in names}
