"""Data-parallel wrapper with contiguous grad buffers; mirrors
`megatron.core.distributed.distributed_data_parallel.DistributedDataParallel`.

What a Megatron user relies on (reference "15 details", item 15):
- every trainable param gets `param.main_grad`, a view into a flat grad buffer; a hook run after
  autograd accumulates `param.grad` adds it into `main_grad` and sets `param.grad = None`
  (gigatron: the first grad after `zero_grad_buffer()` is copied, not added to the zeros:
  same values, one less read of the buffer; `param.main_grad_is_zero` tracks this);
- `zero_grad_buffer()` must be called at the start of every iteration;
- grads are pre-scaled by 1/(dp * cp) before a SUM collective (or averaged in the collective
  with `average_in_collective`); 1.0 with `calculate_per_token_loss` (finalize_model_grads
  divides by the token count);
- the DP collective runs over the DP x CP group; expert params (`param.allreduce = False`) use
  the expert-DP group, still scaled by 1/(dp * cp);
- `no_sync()` defers communication to the last microbatch; with `overlap_grad_reduce` each
  bucket's collective starts from the backward hook of its last ready param.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core._param_layout import FullParamLayout
from gigatron.core.distributed.distributed_data_parallel_config import (
    DistributedDataParallelConfig,
)
from gigatron.core.distributed.param_and_grad_buffer import (
    _ParamAndGradBuffer,
    group_params_for_buffers,
    partition_buckets,
)
from gigatron.core.tensor_parallel.wgrad import WGRAD_IN_MAIN_GRAD
from gigatron.core.transformer.transformer_layer import TransformerLayer


def _groups(pg_collection):
    """(dp_cp, expt_dp, pp) groups: from `pg_collection` if given, else parallel_state."""
    if pg_collection is not None:
        return pg_collection.dp_cp, pg_collection.expt_dp, getattr(pg_collection, "pp", None)

    if not ps.model_parallel_is_initialized():
        raise RuntimeError(
            "DistributedDataParallel needs parallel_state.initialize_model_parallel(...) first "
            "(or a pg_collection)"
        )
    return (
        ps.get_data_parallel_group(with_context_parallel=True),
        ps.get_expert_data_parallel_group(),
        ps.get_pipeline_model_parallel_group(),
    )


def _group_size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


class DistributedDataParallel(torch.nn.Module):
    """Wrap `module` for data parallelism (see module doc). `forward` calls the module."""

    wraps_model = True  # core.utils.unwrap_model follows .module

    def __init__(
        self,
        config,
        ddp_config: DistributedDataParallelConfig,
        module: torch.nn.Module,
        disable_bucketing: bool = False,
        pg_collection=None,
        full_param_layout=None,
    ):
        super().__init__()
        self.config = config
        self.module = module
        self.dp_cp_group, self.expt_dp_group, self.pp_group = _groups(pg_collection)
        dp_cp_size = _group_size(self.dp_cp_group)
        if ddp_config.bucket_size is None:
            ddp_config.bucket_size = max(40_000_000, 1_000_000 * dp_cp_size)
        if not ddp_config.overlap_grad_reduce:
            ddp_config.bucket_size = None  # one bucket per buffer: nothing to overlap with
        self.ddp_config = ddp_config
        # Later PP stages and non-first VPP chunks are not on the critical path: no bucketing.
        pp_rank = dist.get_rank(self.pp_group) if self.pp_group is not None else 0
        self.bucket_size = None if (disable_bucketing or pp_rank > 0) else ddp_config.bucket_size

        param_to_name = {}
        self.params_with_grad = []
        for name, param in self.module.named_parameters():
            if not param.requires_grad:
                continue
            self.params_with_grad.append(param)
            param.grad_added_to_main_grad = False
            param.main_grad_is_zero = True  # the new grad buffer is zeroed
            param_to_name[param] = name
        groups = group_params_for_buffers(self.params_with_grad, ddp_config.grad_reduce_in_fp32)
        has_expert = any(key.is_expert_parallel for key in groups)

        if pg_collection is not None and (
            self.dp_cp_group is None or (has_expert and self.expt_dp_group is None)
        ):
            raise ValueError(
                "DistributedDataParallel: pg_collection must provide dp_cp (and expt_dp when the "
                "module has expert params with allreduce=False) (distributed_data_parallel.py)"
            )
        per_token = getattr(config, "calculate_per_token_loss", False)
        if per_token:
            scale, expert_scale = 1.0, 1.0
        elif ddp_config.average_in_collective:
            scale = 1.0
            expert_scale = _group_size(self.expt_dp_group) / dp_cp_size
        else:
            scale = expert_scale = 1.0 / dp_cp_size
        if per_token and ddp_config.average_in_collective:
            raise ValueError(
                "average_in_collective (True) cannot be used with calculate_per_token_loss "
                "(True): per-token grads must be summed (distributed_data_parallel.py)"
            )
        layouts = self._layouts(groups, full_param_layout)
        self.full_param_layout = full_param_layout
        self.buffers, self.expert_parallel_buffers = [], []
        for key, (params, indices) in groups.items():
            group, factor = (
                (self.expt_dp_group, expert_scale)
                if key.is_expert_parallel
                else (self.dp_cp_group, scale)
            )
            buffer = _ParamAndGradBuffer(
                ddp_config, key.param_dtype, key.grad_dtype, params, group, self.bucket_size,
                param_to_name, factor, param_indices=indices, param_layout=layouts[key],
            )  # fmt: skip
            (self.expert_parallel_buffers if key.is_expert_parallel else self.buffers).append(
                buffer
            )
        self.bucket_groups = partition_buckets(self.buffers, ddp_config)
        self.expert_parallel_bucket_groups = partition_buckets(
            self.expert_parallel_buffers, ddp_config
        )
        all_groups = self.bucket_groups + self.expert_parallel_bucket_groups
        # Param all-gathers are dispatched in order; finishing one starts the next.
        for i in range(len(all_groups) - 1):
            all_groups[i].next_param_gather_bucket_group = all_groups[i + 1]
        self.param_to_bucket_group = {p: g for g in all_groups for p in g.params}

        self._hook_handles = [
            p.register_post_accumulate_grad_hook(self._make_backward_post_hook(p))
            for p in self.params_with_grad
        ]
        for p in self.params_with_grad:
            if getattr(p, WGRAD_IN_MAIN_GRAD, False):
                # A compiled backward updates this main_grad in place (wgrad.py); its storage
                # never moves, so CUDA graphs may keep it as a static input instead of copying
                # it and skipping the graph for the mutation.
                torch._dynamo.mark_static_address(p.main_grad, guard=False)
        self.use_forward_hook = (
            ddp_config.use_distributed_optimizer and ddp_config.overlap_param_gather
        )
        self.remove_forward_pre_hook_handles = {}
        if self.use_forward_hook:
            self.enable_forward_pre_hook()
        self.overlap_param_gather_with_optimizer_step = False

    def _layouts(self, groups: dict, full_param_layout) -> dict:
        """BufferKey -> the layout its buffer is built from: `full_param_layout`'s (it must
        name exactly the buffers these params make) or None (the buffer lays itself out:
        padded with the distributed optimizer, packed without)."""
        if full_param_layout is None:
            return dict.fromkeys(groups)
        if not isinstance(full_param_layout, FullParamLayout):
            raise ValueError(
                f"DistributedDataParallel: full_param_layout ({type(full_param_layout).__name__})"
                " must be a FullParamLayout (DistributedOptimizer.compute_full_param_layout)"
            )
        given, needed = set(full_param_layout.layouts), set(groups)
        if given != needed:
            raise ValueError(
                f"DistributedDataParallel: full_param_layout has buffers {sorted(map(str, given))}"
                f" but the module's trainable params make {sorted(map(str, needed))}; compute "
                "it from the same params (DistributedOptimizer.compute_full_param_layout)"
            )
        for key, (params, _) in groups.items():
            placed = set(full_param_layout.layouts[key].param_index_map)
            if placed != set(params):
                raise ValueError(
                    f"DistributedDataParallel: full_param_layout's buffer {key} places "
                    f"{len(placed)} params but the module has {len(params)} for it"
                )
        return dict(full_param_layout.layouts)

    def _all_bucket_groups(self):
        return self.bucket_groups + self.expert_parallel_bucket_groups

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    # ---- hooks ---------------------------------------------------------------------------
    def _make_backward_post_hook(self, param: torch.nn.Parameter):
        """After autograd accumulated `param.grad`: move it into main_grad, maybe launch."""

        group = self.param_to_bucket_group[param]
        overlap = self.ddp_config.overlap_grad_reduce

        def hook(p: torch.Tensor) -> None:
            grad = p.grad
            # dW already in main_grad: set by the linear's eager backward (Megatron's flag) or,
            # for a compiled backward, the layer's construction-time mark (wgrad.py). A tied
            # weight (`zero_out_wgrad`) got zeros from the linear: its .grad holds the other
            # uses' grads, added on top (Megatron's rule).
            fused = p.grad_added_to_main_grad or getattr(p, WGRAD_IN_MAIN_GRAD, False)
            if grad is not None and (not fused or getattr(p, "zero_out_wgrad", False)):
                # First grad since zero_grad_buffer, nothing fused in: main_grad holds zeros, so
                # a copy gives the same values as Megatron's add_ and reads one buffer less.
                if p.main_grad_is_zero and not fused:
                    p.main_grad.copy_(grad)
                else:
                    p.main_grad.add_(grad)
            p.main_grad_is_zero = False
            p.grad = None
            if overlap:
                group.register_grad_ready(param)

        return hook

    def _param_gather_units(self) -> dict:
        """{unit: the bucket groups its forward pre-hook waits for, in dispatch order}.

        Megatron hooks every module and waits for the groups of its own params. gigatron hooks
        each TransformerLayer as one unit (all its params), each group of layers that
        `compile_transformer_layers(layers_per_graph=...)` compiled as one graph (unit
        `(block, index)`, waited on before the group runs), and, outside the layers, the
        modules that own params. The hooks are never traced: one traced inside a compiled
        graph guarded on the identity of every param it looked up, so each layer recompiled
        until dynamo's recompile limit and the remaining layers ran eagerly
        (`--overlap-param-gather --torch-compile`, DP = 2 on GPUs)."""

        order = {id(g): i for i, g in enumerate(self._all_bucket_groups())}
        units: dict = {}

        def add(key, params) -> None:
            groups = {id(g): g for p in params if (g := self.param_to_bucket_group.get(p))}
            if groups:
                units[key] = sorted(groups.values(), key=lambda g: order[id(g)])

        def visit(module: torch.nn.Module) -> None:
            if isinstance(module, TransformerLayer):
                add(module, module.parameters())
                return
            add(module, module.parameters(recurse=False))
            bounds = getattr(module, "_compiled_layer_group_bounds", None)
            for name, child in module.named_children():
                if bounds and name == "layers":
                    for index, (start, end) in enumerate(bounds):
                        add((module, index), (p for m in child[start:end] for p in m.parameters()))
                else:
                    visit(child)

        visit(self.module)
        return units

    def _make_forward_pre_hook(self, groups: list):
        skip_next = self.ddp_config.align_param_gather

        @torch._dynamo.disable
        def hook(module, *unused):
            for group in groups:
                group.finish_param_sync(skip_next_bucket_dispatch=skip_next)

        return hook

    def enable_forward_pre_hook(self) -> None:
        """Wait for each unit's param all-gather right before its forward (units above)."""
        assert self.use_forward_hook and not self.remove_forward_pre_hook_handles
        for unit, groups in self._param_gather_units().items():
            hook = self._make_forward_pre_hook(groups)
            if isinstance(unit, tuple):  # a compiled group of layers: its block runs the hook
                block, index = unit
                block.__dict__.setdefault("_layer_group_pre_hooks", {})[index] = hook
                handle = _GroupHookHandle(block, index)
            else:
                handle = unit.register_forward_pre_hook(hook)
            self.remove_forward_pre_hook_handles[unit] = handle

    def disable_forward_pre_hook(self, param_sync: bool = True) -> None:
        """Remove the pre-hooks; all-gather synchronously now unless `param_sync=False`."""
        assert self.use_forward_hook
        for handle in self.remove_forward_pre_hook_handles.values():
            handle.remove()
        self.remove_forward_pre_hook_handles = {}
        if param_sync:
            self.start_param_sync(force_sync=True)

    # ---- communication -------------------------------------------------------------------
    @contextmanager
    def no_sync(self):
        """Accumulate grads without communication (all microbatches but the last)."""
        for group in self._all_bucket_groups():
            group.is_last_microbatch = False
        try:
            yield
        finally:
            for group in self._all_bucket_groups():
                group.is_last_microbatch = True

    def start_param_sync(self, *unused, force_sync: bool = False, force_dispatch: bool = False):
        """All-gather updated params (distributed optimizer): async with overlap_param_gather
        (waited on by forward pre-hooks), else synchronous."""
        if not self.ddp_config.use_distributed_optimizer:
            return
        if not force_sync and self.overlap_param_gather_with_optimizer_step and not force_dispatch:
            return
        for group in self._all_bucket_groups():
            group.start_param_sync(force_sync=force_sync)

    def start_grad_sync(self, *unused) -> None:
        """Launch every bucket's grad collective (async with overlap_grad_reduce)."""
        for group in self._all_bucket_groups():
            if group.grad_reduce_handle is None:
                group.start_grad_sync()

    def finish_grad_sync(self, force_all_reduce: bool | None = False) -> None:
        """Complete every bucket's grad collective (runs it now without overlap)."""
        for group in self._all_bucket_groups():
            group.finish_grad_sync(force_all_reduce=bool(force_all_reduce))

    def scale_gradients(self, scaling_factor: float) -> None:
        """Multiply every grad buffer by `scaling_factor`."""
        for buffer in self.buffers + self.expert_parallel_buffers:
            buffer.scale_gradients(scaling_factor)

    def zero_grad_buffer(self) -> None:
        """Zero all grad buffers and reset bucket state. Call at the start of each iteration."""
        for param in self.params_with_grad:
            param.grad_added_to_main_grad = False
            param.main_grad_is_zero = True
            # An FP32Optimizer leaves .grad aliasing main_grad; autograd must not add into it.
            param.grad = None
        for buffer in self.buffers + self.expert_parallel_buffers:
            buffer.reset()
        for group in self._all_bucket_groups():
            group.reset()

    def broadcast_params(self) -> None:
        """Copy params from DP rank 0 (expert params: expert-DP rank 0) to the other replicas."""
        for param in self.module.parameters():
            is_expert = not getattr(param, "allreduce", True)
            group = self.expt_dp_group if is_expert else self.dp_cp_group
            if _group_size(group) > 1:
                src = dist.get_global_rank(group, 0)
                dist.broadcast(param.data, src=src, group=group)

    # ---- state dict passthrough (checkpoints hold the bare module's keys) -----------------
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)

    def sharded_state_dict(self, *args, **kwargs):
        return self.module.sharded_state_dict(*args, **kwargs)


class _GroupHookHandle:
    """`remove()` for a layer group's pre-hook (kept in its block, not in torch's hook dict)."""

    def __init__(self, block: torch.nn.Module, index: int):
        self.block, self.index = block, index

    def remove(self) -> None:
        self.block.__dict__.get("_layer_group_pre_hooks", {}).pop(self.index, None)
