"""ZeRO-1 style distributed optimizer; mirrors `megatron.core.optimizer.distrib_optimizer`.

DDP (with `use_distributed_optimizer=True`) keeps params and grads in flat buffers whose buckets
split into dp equal shards. DP rank r owns shard r of every bucket. For each model param that
overlaps its shard, this rank keeps an fp32 "main" copy of just the overlapping range, and the
torch optimizer (and so its state: Adam's exp_avg / exp_avg_sq) only ever sees those ranges:

    bucket  [ p2 ........ | p1 ...... p0 ]       params laid out by DDP
    shards  [ rank 0      | rank 1       ]       rank 1 steps p1[..] and p0 only

Step: DDP reduce-scatters the grads (each rank gets the summed grad of its shard) -> unscale /
inf check / clip over all ranks (shards are disjoint, so norms add up over DP too) -> local
step on the fp32 shards -> copy into the model-dtype param buffer -> all-gather the buckets
(`start_param_sync`; asynchronous and waited on in forward with `overlap_param_gather`).
fp32 models: the main shard *is* a view of the param buffer (no extra copy), as in Megatron.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from gigatron.core._buffer_layout import group_params_for_buffers, padded_param_layout
from gigatron.core._param_layout import FullParamLayout, PerBufferParamLayout
from gigatron.core.optimizer.optimizer import MixedPrecisionOptimizer, _copy_attrs


class DistributedOptimizer(MixedPrecisionOptimizer):
    """Optimizer state and fp32 main params sharded over the data-parallel group."""

    @staticmethod
    def _compute_per_buffer_param_layout(
        params: list,
        bucket_size: int | None,
        data_parallel_world_size: int,
        ddp_config,
        param_indices: list[int] | None = None,
    ) -> PerBufferParamLayout:
        """The padded layout of one buffer (reverse param order, 64-element aligned starts,
        buckets padded to split into `data_parallel_world_size` shards, tied embeddings in a
        bucket of their own)."""
        return padded_param_layout(
            params, bucket_size, data_parallel_world_size, ddp_config, param_indices
        )

    @staticmethod
    def compute_full_param_layout(
        params: list,
        bucket_size: int | None,
        data_parallel_world_size: int,
        ddp_config,
        expert_data_parallel_world_size: int | None = None,
    ) -> FullParamLayout:
        """Padded layouts of every buffer DDP will build from `params` (grouped by BufferKey);
        expert buffers are padded for `expert_data_parallel_world_size` (default: the dense
        DP size). Pass the result to `DistributedDataParallel(full_param_layout=...)`."""
        layouts = {}
        groups = group_params_for_buffers(params, ddp_config.grad_reduce_in_fp32)
        for key, (members, indices) in groups.items():
            dp_size = data_parallel_world_size
            if key.is_expert_parallel and expert_data_parallel_world_size is not None:
                dp_size = expert_data_parallel_world_size
            layouts[key] = DistributedOptimizer._compute_per_buffer_param_layout(
                members, bucket_size, dp_size, ddp_config, indices
            )
        return FullParamLayout(layouts=layouts)

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        config,
        grad_scaler,
        init_state_fn: Callable,
        model_chunks: list,
        per_model_buffers: dict,
        data_parallel_group,
        data_parallel_group_gloo=None,
        data_parallel_group_idx: int | None = None,
        distributed_optimizer_instance_id: int = 0,
    ):
        super().__init__(optimizer, config, grad_scaler, init_state_fn)
        self.model_chunks = model_chunks
        self.per_model_buffers = per_model_buffers
        self.data_parallel_group = data_parallel_group
        self.data_parallel_group_gloo = data_parallel_group_gloo
        self.buffers = [b for buffers in per_model_buffers.values() for b in buffers]
        for buffer in self.buffers:
            if not buffer.ddp_config.use_distributed_optimizer:
                raise ValueError(
                    "DistributedOptimizer needs DDP built with "
                    "DistributedDataParallelConfig(use_distributed_optimizer=True)"
                )
        self.ddp_config = self.buffers[0].ddp_config if self.buffers else None
        # The bucket groups over this optimizer's buffers (dense or expert): the only ones whose
        # params it must all-gather after its step.
        my_buckets = {id(b) for buffer in self.buffers for b in buffer.buckets}
        self.bucket_groups = [
            g
            for chunk in model_chunks
            for g in chunk.bucket_groups + chunk.expert_parallel_bucket_groups
            if any(id(b) in my_buckets for b in g.buckets)
        ]
        # param -> (lo, hi): this rank's range inside param.view(-1)
        self.model_param_shard_range = self._build_shard_ranges()
        # One list per param group of (model_param, main_shard, lo, hi).
        self.shard_groups: list[list[tuple]] = []
        for group in self.optimizer.param_groups:
            entries, shard_params = [], []
            for param in group["params"]:
                if param not in self.model_param_shard_range:
                    continue  # nothing of this param lives in this rank's shards
                lo, hi = self.model_param_shard_range[param]
                model_shard = param.detach().view(-1)[lo:hi]
                if param.dtype == torch.float32:
                    main = torch.nn.Parameter(model_shard)  # aliases the param buffer
                else:
                    main = torch.nn.Parameter(model_shard.clone().float())
                _copy_attrs(main, param)
                entries.append((param, main, lo, hi))
                shard_params.append(main)
            group["params"] = shard_params
            self.shard_groups.append(entries)
        # gigatron-only: one flat fused Adam pass per shard (_flat_adam_step.py); on CUDA by
        # default where it applies, config.flat_adam_step False / True turns it off / forces it
        self._flat_step = None
        from gigatron.core.optimizer._flat_adam_step import FlatAdamStep, flat_step_wanted

        if flat_step_wanted(self):
            self._flat_step = FlatAdamStep(self)

    def bucket_shards(self):
        """(buffer, bucket, s0, s1) for every bucket: this rank's shard [s0, s1) of it, in the
        buffer's flat coordinates."""
        for buffer in self.buffers:
            size = buffer.data_parallel_world_size
            rank = dist.get_rank(buffer.data_parallel_group) if size > 1 else 0
            for bucket in buffer.buckets:
                shard = bucket.grad_data.numel() // size
                s0 = bucket.offset + rank * shard
                yield buffer, bucket, s0, s0 + shard

    def _build_shard_ranges(self) -> dict:
        ranges = {}
        for buffer, bucket, s0, s1 in self.bucket_shards():
            for param in bucket.params_list:
                p0, p1, _ = buffer.param_index_map[param]
                lo, hi = max(p0, s0), min(p1, s1)
                if lo < hi:
                    ranges[param] = (lo - p0, hi - p0)
        return ranges

    def _entries(self):
        return [e for group in self.shard_groups for e in group]

    def _copy_model_grads_to_main_grads(self) -> None:
        # fp32 grad buffers: the shard views are made once (`param.main_grad` is a view of
        # DDP's buffer, which lives as long as the model), ~300 slicings a step of host time
        # saved. fp16 / bf16 buffers: a fresh fp32 copy each step.
        cache = self.__dict__.setdefault("_main_grad_views", {})
        for param, main, lo, hi in self._entries():
            main_grad = param.main_grad
            if main_grad.dtype != torch.float32:
                main.grad = main_grad.view(-1)[lo:hi].float()
                continue
            hit = cache.get(id(main))
            if hit is None or hit[0] is not main_grad:
                hit = (main_grad, main_grad.view(-1)[lo:hi])
                cache[id(main)] = hit
            main.grad = hit[1]

    def _copy_main_params_to_model_params(self) -> None:
        # one multi-tensor copy (fp32 -> model dtype) instead of a launch per param; fp32
        # params' main shards alias the param buffer already
        pairs = [
            (param.detach().view(-1)[lo:hi], main.detach())
            for param, main, lo, hi in self._entries()
            if param.dtype != torch.float32
        ]
        if pairs:
            torch._foreach_copy_(*map(list, zip(*pairs, strict=True)))

    def _clip_grads_by_norm(self, clip_grad: float, grad_norm: float) -> None:
        """As MegatronOptimizer's; with the flat Adam step the scaling is folded into its pass
        (no separate pass over the grads)."""
        if self._flat_step is None:
            return super()._clip_grads_by_norm(clip_grad, grad_norm)
        from gigatron.core.optimizer.clip_grads import clip_coefficient

        self._flat_step.grad_scale = clip_coefficient(clip_grad, grad_norm)

    def _step_on_device(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """The sync-free step (see MegatronOptimizer's); the flat step takes the clipping
        coefficient and the skip flag as device tensors into its pass. Its Adam step counts
        live on the host and advance on a skipped step too (the training loop stops at the next
        log line on a NaN/Inf norm, before any save)."""
        if self._flat_step is None:
            return super()._step_on_device(grad_norm)
        nonfinite = ~torch.isfinite(grad_norm)
        coeff = (self.config.clip_grad / (grad_norm + 1.0e-6)).clamp(max=1.0)
        coeff = torch.where(nonfinite, torch.ones_like(coeff), coeff)
        self._flat_step.device_clip = (coeff.float(), nonfinite)
        try:
            self.step_with_ready_grads()
        finally:
            self._flat_step.device_clip = None
        return nonfinite

    def step_with_ready_grads(self) -> bool:
        if self._flat_step is not None:
            self._flat_step.step()  # main params, Adam state and model params in one pass
        else:
            self.optimizer.step()
            self._copy_main_params_to_model_params()
        # With overlap_param_gather the forward pre-hooks all-gather, bucket by bucket.
        if self.ddp_config is not None and not self.ddp_config.overlap_param_gather:
            for group in self.bucket_groups:
                group.start_param_sync()
        return True

    def reload_model_params(self, state_dict=None) -> None:
        for param, main, lo, hi in self._entries():
            if param.dtype != torch.float32:
                main.data.copy_(param.detach().view(-1)[lo:hi])

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._flat_step is not None:
            self._flat_step.grad_scale = 1.0  # a clip_grad_norm() whose step never ran
        for param, main, _, _ in self._entries():
            param.grad = None
            main.grad = None

    def state_dict(self) -> dict:
        """This rank's shard: inner optimizer state, scaler, fp32 main shards."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
            "shard_main_params": [m.detach().clone() for _, m, _, _ in self._entries()],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.grad_scaler is not None and state_dict.get("grad_scaler") is not None:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
        entries = self._entries()
        for (_, main, _, _), saved in zip(entries, state_dict["shard_main_params"]):
            main.data.copy_(saved)
        if self._flat_step is not None:
            self._flat_step.resync()  # the load replaced the Adam state tensors
        self._copy_main_params_to_model_params()
        for group in self.bucket_groups:
            group.start_param_sync(force_sync=True)
