"""The optimizer of FSDP-sharded model chunks (Megatron-FSDP / `--use-torch-fsdp2`).

The params are DTensors whose local shards are fp32 (the main params); the torch optimizer
steps them in place (Adam's moments are DTensors of the same shards), so nothing is copied
before or after the step. Norms, clipping and zero counts work on the local shards, reduced
over every rank (the shards differ across DP, TP and PP ranks; TP replicas count once as
under DDP) or, for `no_shard`'s replicated shards, over the model-parallel group only.
"""

from __future__ import annotations

import torch

from gigatron.core.optimizer.clip_grads import (
    _all_reduce,
    _is_not_tp_duplicate,
    _stats_device,
    clip_coefficient,
    param_is_not_shared,
)
from gigatron.core.optimizer.optimizer import FP32Optimizer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class FullyShardedOptimizer(FP32Optimizer):
    """FP32Optimizer over DTensor shards (module doc)."""

    steps_dtensor_shards = True  # dist_checkpointing.optimizer saves the local shards

    def _grads_for_norm(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        counted, left_out = [], []
        for p in self.get_parameters():
            if p.grad is None:
                continue
            counts = param_is_not_shared(p) and _is_not_tp_duplicate(p, self.tp_group)
            (counted if counts else left_out).append(_local(p.grad))
        return counted, left_out

    def _clip_grads_by_norm(self, clip_grad: float, grad_norm: float) -> None:
        grads = [_local(p.grad) for p in self.get_parameters() if p.grad is not None]
        coeff = clip_coefficient(clip_grad, grad_norm)
        if coeff < 1.0 and grads:
            torch._foreach_mul_(grads, coeff)

    def count_zeros(self) -> float:
        counted, _ = self._grads_for_norm()
        group = self.get_grad_stats_parallel_group()
        total = torch.zeros(1, dtype=torch.float32, device=_stats_device(counted, group))
        for g in counted:
            total += g.numel() - torch.count_nonzero(g)
        _all_reduce(total, torch.distributed.ReduceOp.SUM, group)
        return total.item()
