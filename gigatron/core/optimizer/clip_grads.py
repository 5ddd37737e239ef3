"""Global gradient norm, clipping and zero counting; mirrors `megatron.core.optimizer.clip_grads`.

Each rank sums the squares of the grads it is responsible for, then one all-reduce over
`grad_stats_parallel_group` adds the partial sums: the model-parallel group (TP x PP) for the
plain optimizers, where DP replicas hold identical reduced grads, and every rank for the
distributed optimizer, where each DP rank holds a different shard. A grad counts once:
TP-replicated params (not `tensor_model_parallel`) only on TP rank 0, and params marked
`shared` (tied embeddings on the last stage) not at all.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def param_is_not_shared(param: torch.Tensor) -> bool:
    """False for the second copy of a tied weight (Megatron's `param.shared = True`)."""
    return not getattr(param, "shared", False)


def _is_not_tp_duplicate(param: torch.Tensor, tp_group=None) -> bool:
    """tensor_parallel's param_is_not_tensor_parallel_duplicate (TP-split, or TP rank 0), also
    usable without process groups (one process: nothing is duplicated)."""
    if getattr(param, "tensor_model_parallel", False):
        return True
    if tp_group is None or not dist.is_initialized():
        return True
    from gigatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    return param_is_not_tensor_parallel_duplicate(param, tp_group=tp_group)


def _stats_device(tensors, group) -> torch.device:
    """Where the reduced statistic lives: the grads' device, else the group's (NCCL: CUDA)."""
    if tensors:
        return tensors[0].device
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(t: torch.Tensor, op, group) -> None:
    if dist.is_initialized():
        dist.all_reduce(t, op=op, group=group)


def get_grad_norm_fp32(
    grads_for_norm: list[torch.Tensor] | torch.Tensor,
    norm_type: float = 2,
    grad_stats_parallel_group=None,
    nonfinite_probe: list[torch.Tensor] = (),
) -> float:
    """Global `norm_type`-norm of `grads_for_norm` (already deduplicated) over the group.
    `nonfinite_probe` (gigatron addition): grads that do not count but whose NaN/Inf must make
    the norm NaN (each adds 0 x its norm before the reduction)."""
    norm_type = float(norm_type)
    total = _reduced_norm_total(
        grads_for_norm, norm_type, grad_stats_parallel_group, nonfinite_probe
    )
    return total.item() if norm_type == math.inf else total.item() ** (1.0 / norm_type)


def get_grad_norm_fp32_tensor(
    grads_for_norm: list[torch.Tensor],
    norm_type: float = 2,
    grad_stats_parallel_group=None,
    nonfinite_probe: list[torch.Tensor] = (),
) -> torch.Tensor:
    """`get_grad_norm_fp32` as a 0-dim fp32 tensor on the grads' device, without a host sync
    (gigatron addition; the root is taken in fp32, so it may differ from the float version in
    the last bit)."""
    norm_type = float(norm_type)
    total = _reduced_norm_total(
        grads_for_norm, norm_type, grad_stats_parallel_group, nonfinite_probe
    )
    return (total if norm_type == math.inf else total.pow(1.0 / norm_type)).reshape(())


def _reduced_norm_total(grads_for_norm, norm_type: float, group, nonfinite_probe) -> torch.Tensor:
    """[1] fp32: the max of |g| (inf-norm) or the sum of |g|^p over the grads, reduced over the
    group, plus 0 x the norm of each `nonfinite_probe` grad."""
    if isinstance(grads_for_norm, torch.Tensor):
        grads_for_norm = [grads_for_norm]
    device = _stats_device(list(grads_for_norm) + list(nonfinite_probe), group)
    probe = None
    if nonfinite_probe:
        norms = torch._foreach_norm([g.detach().float() for g in nonfinite_probe], norm_type)
        probe = 0.0 * torch.stack(norms).sum().to(device)  # 0, or NaN for a NaN / Inf grad
    if norm_type == math.inf:
        local = max((g.detach().abs().max().float() for g in grads_for_norm), default=None)
        total = torch.zeros(1, device=device) if local is None else local.reshape(1).clone()
        if probe is not None:
            total += probe
        _all_reduce(total, dist.ReduceOp.MAX, group)
        return total
    total = torch.zeros(1, dtype=torch.float32, device=device)
    if grads_for_norm:
        grads = [g.detach().float() for g in grads_for_norm]
        norms = torch._foreach_norm(grads, norm_type)
        total += torch.stack(norms).pow(norm_type).sum()
    if probe is not None:
        total += probe
    _all_reduce(total, dist.ReduceOp.SUM, group)
    return total


def clip_coefficient(max_norm: float, total_norm: float) -> float:
    """The factor clipping multiplies the grads by: max_norm / (total_norm + 1e-6) when below 1,
    else 1 (also for a NaN norm: no scaling, as Megatron)."""
    coeff = max_norm / (total_norm + 1.0e-6)
    return coeff if coeff < 1.0 else 1.0


def clip_grad_by_total_norm_fp32(
    parameters: list[torch.Tensor] | torch.Tensor, max_norm: float, total_norm: float
) -> None:
    """Scale `.grad` of `parameters` in place by max_norm / (total_norm + 1e-6) when < 1."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    clip_coeff = clip_coefficient(max_norm, total_norm)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


def count_zeros_fp32(
    parameters: list[torch.Tensor] | torch.Tensor, grad_stats_parallel_group=None, tp_group=None
) -> float:
    """Number of zero grad entries, deduplicated like the norm, summed over the group."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    device = _stats_device(grads, grad_stats_parallel_group)
    total = torch.zeros(1, dtype=torch.float32, device=device)
    for p in parameters:
        if p.grad is None or not param_is_not_shared(p) or not _is_not_tp_duplicate(p, tp_group):
            continue
        total += p.grad.numel() - torch.count_nonzero(p.grad)
    _all_reduce(total, dist.ReduceOp.SUM, grad_stats_parallel_group)
    return total.item()
