"""Rank-aware printing, small reductions and argument helpers of the training loop.

Mirrors `megatron.training.utils.common_utils`. Reductions take an optional `group=`
(Megatron 0.20) and default to `parallel_state`'s group once, at the edge.
"""

from __future__ import annotations

import json
import math
import os
import warnings

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.datasets.utils import get_blend_from_list
from gigatron.core.optimizer.clip_grads import param_is_not_shared
from gigatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from gigatron.training.global_vars import get_args


def _this_rank() -> int:
    """torch.distributed's rank, else the launcher's RANK, else 0 (a single process)."""
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_rank0() -> bool:
    return _this_rank() == 0


def is_last_rank() -> bool:
    """True on the last global rank (always, without torch.distributed)."""
    return not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1


def print_rank_0(message, rank: int | None = None) -> None:
    """Print on rank 0 only: `rank` when given, else this process's rank."""
    if (_this_rank() if rank is None else rank) == 0:
        print(message, flush=True)


def warn_rank_0(message, rank: int | None = None) -> None:
    """`warnings.warn(message)` on rank 0 only (`rank` when given, else this process's)."""
    if (_this_rank() if rank is None else rank) == 0:
        warnings.warn(message, stacklevel=2)


def print_rank_last(message) -> None:
    """Print on the last global rank (where the loss lives under pipelining)."""
    if is_last_rank():
        print(message, flush=True)


def average_losses_across_data_parallel_group(losses, group=None) -> torch.Tensor:
    """Mean of each loss over `group` (default: the data-parallel group). [n] tensor."""
    group = ps.get_data_parallel_group() if group is None else group
    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    dist.all_reduce(averaged, group=group)
    return averaged / dist.get_world_size(group=group)


def reduce_max_stat_across_model_parallel_group(stat: float | None, group=None) -> float | None:
    """Max of `stat` over `group` (default: model-parallel). Ranks without the stat pass None;
    None comes back only when no rank has it (Megatron's -1.0 sentinel)."""
    group = ps.get_model_parallel_group() if group is None else group
    value = torch.tensor([-1.0 if stat is None else stat], dtype=torch.float32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return None if value.item() == -1.0 else value.item()


def logical_and_across_model_parallel_group(input: bool, group=None) -> bool:
    """True when `input` is True on every rank of `group` (default: model-parallel)."""
    group = ps.get_model_parallel_group() if group is None else group
    value = torch.tensor([1 if input is True else 0], dtype=torch.int)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return bool(value.item())


def _norm_data(param, force_create_fp32_copy: bool, bf16: bool) -> torch.Tensor | None:
    """What the norm counts: under bf16 the optimizer's fp32 `main_param` when the param has
    one (None when a distributed optimizer keeps this shard elsewhere), else an fp32 copy."""
    if not bf16:
        return param.detach()
    if not force_create_fp32_copy and hasattr(param, "main_param"):
        return None if param.main_param is None else param.main_param.detach()
    return param.detach().float()


def calc_params_l2_norm(model, force_create_fp32_copy: bool = False) -> float:
    """L2 norm of all parameters, every logical element counted once (reads `get_args().bf16`)."""
    bf16 = bool(getattr(get_args(), "bf16", False))
    return params_l2_norm(model, bf16=bf16, force_create_fp32_copy=force_create_fp32_copy)


def params_l2_norm(model, *, bf16: bool, force_create_fp32_copy: bool = False) -> float:
    """`calc_params_l2_norm` with `bf16` given.

    Dense params: TP duplicates and tied (`shared`) copies skipped, summed over the
    model-parallel group; expert params (`allreduce=False`) over the expert-tensor x expert x
    pipeline group. Distributed-optimizer shards (`main_param_sharded`) add a data-parallel sum.
    """
    chunks = model if isinstance(model, list) else [model]
    device = next((p.device for c in chunks for p in c.parameters()), torch.device("cpu"))
    keys = ("dense", "dense_sharded", "moe", "moe_sharded")
    sums = {key: torch.zeros(1, device=device) for key in keys}
    for chunk in chunks:
        for param in chunk.parameters():
            if not param_is_not_tensor_parallel_duplicate(param):
                continue
            is_expert = not getattr(param, "allreduce", True)
            if not is_expert and not param_is_not_shared(param):
                continue
            data = _norm_data(param, force_create_fp32_copy, bf16)
            if data is None:
                continue
            sharded = bf16 and getattr(param, "main_param_sharded", False)
            key = ("moe" if is_expert else "dense") + ("_sharded" if sharded else "")
            sums[key] += data.float().pow(2).sum().to(device)
    dp_cp_group = ps.get_data_parallel_group(with_context_parallel=True)
    dist.all_reduce(sums["dense_sharded"], group=dp_cp_group)
    dist.all_reduce(sums["moe_sharded"], group=ps.get_expert_data_parallel_group())
    dense = sums["dense"] + sums["dense_sharded"]
    moe = sums["moe"] + sums["moe_sharded"]
    dense_group = ps.get_model_parallel_group()
    expert_group = ps.get_expert_tensor_model_pipeline_parallel_group()
    if dist.get_process_group_ranks(dense_group) == dist.get_process_group_ranks(expert_group):
        dense += moe
        dist.all_reduce(dense, group=dense_group)
    else:
        dist.all_reduce(dense, group=dense_group)
        dist.all_reduce(moe, group=expert_group)
        dense += moe
    return math.sqrt(dense.item())


def is_hybrid_model(args) -> bool:
    """True for a hybrid Mamba-Transformer model (`args.hybrid_layer_pattern` set)."""
    return getattr(args, "hybrid_layer_pattern", None) is not None


def is_first_or_last_pipeline_stage(vp_stage: int | None) -> bool:
    """First or last pipeline stage; with `vp_stage` given, of the virtual pipeline too."""
    ignore_virtual = vp_stage is None
    return ps.is_pipeline_first_stage(
        ignore_virtual=ignore_virtual, vp_stage=vp_stage
    ) or ps.is_pipeline_last_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage)


def get_device_arch_version() -> int:
    """Major compute capability of CUDA device 0 (8: Ampere, 9: Hopper, 10: Blackwell).

    A CUDA query: without a CUDA device it raises RuntimeError, as Megatron's call fails."""
    if not torch.cuda.is_available():
        raise RuntimeError("get_device_arch_version needs a CUDA device; none is available")
    return torch.cuda.get_device_properties(torch.device("cuda:0")).major


def _split_list(value):
    return value.split() if isinstance(value, str) else value


def get_blend_and_blend_per_split(args):
    """(blend, blend_per_split) from `--data-path` / `--data-args-path` or the per-split
    `--{train,valid,test}-data-path` / `--per-split-data-args-path` (a JSON file); both None
    when neither is given."""
    data_args_path = getattr(args, "data_args_path", None)
    per_split_args_path = getattr(args, "per_split_data_args_path", None)
    per_split = [getattr(args, f"{s}_data_path", None) for s in ("train", "valid", "test")]
    if args.data_path is not None or data_args_path is not None:
        if data_args_path is not None:
            if args.data_path is not None:
                raise ValueError("give --data-path or --data-args-path, not both")
            with open(data_args_path) as f:
                return get_blend_from_list(f.read().split()), None
        return get_blend_from_list(args.data_path), None
    if per_split_args_path is not None:
        with open(per_split_args_path) as f:
            loaded = json.load(f)
        per_split = [_split_list(loaded[s]) for s in ("train", "valid", "test")]
    elif all(p is None for p in per_split):
        return None, None
    return None, [get_blend_from_list(p) for p in per_split]


def update_use_dist_ckpt(args) -> None:
    """`args.use_dist_ckpt`: every checkpoint format but "torch" is a distributed one."""
    args.use_dist_ckpt = args.ckpt_format != "torch"


def to_empty_if_meta_device(module: torch.nn.Module, *, device: torch.device, recurse=True):
    """Move tensors to `device`; those on the meta device become `empty_like` there (the
    others keep their values, unlike `Module.to_empty`)."""

    def move(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device=device) if t.device.type == "meta" else t.to(device)

    return module._apply(move, recurse=recurse)


def get_local_rank_preinit() -> int:
    """This process's local rank before torch.distributed starts: LOCAL_RANK (torchrun), else
    SLURM_LOCALID inside a SLURM job (SLURM_NTASKS set), else 0 with a warning."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if "SLURM_NTASKS" in os.environ and "SLURM_LOCALID" in os.environ:
        return int(os.environ["SLURM_LOCALID"])
    warnings.warn(
        "Could not determine local rank from LOCAL_RANK or SLURM_LOCALID. Defaulting to 0.",
        stacklevel=2,
    )
    return 0


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
