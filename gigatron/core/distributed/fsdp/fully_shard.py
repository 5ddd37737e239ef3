"""Fully sharded data parallelism on PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`).

The engine under `FullyShardedDataParallel` (Megatron-FSDP's flags) and
`TorchFullyShardedDataParallel` (`--use-torch-fsdp2`). Each FSDP unit (by default every
`TransformerLayer`, outermost match wins) and then the root module become FSDP2 modules over a
mesh of the data-parallel (x context-parallel) group only: tensor, sequence and pipeline
parallelism stay as they are, so a TP-sharded weight `[o/tp, h]` is further cut along dim 0
over DP ranks:

    param (DTensor, Shard(0) over dp_cp)   [o/tp, h] global -> [ceil(o/tp / dp), h] local
    forward / backward of a unit:          all-gather -> [o/tp, h] (compute dtype), then free
    after backward:                        reduce-scatter (average over dp_cp) -> local shard

Megatron's sharding strategies map onto FSDP2's options:

    strategy             mesh                          reshard_after_forward
    no_shard             (dp_cp replicate, 1 shard)    False  (HSDP with shards of one rank:
                                                              replicated params, all-reduce)
    optim, optim_grads   (dp_cp shard)                 False  (params gathered once a step)
    optim_grads_params   (dp_cp shard)                 True   (ZeRO-3)

FSDP2 keeps only the grad shard after the reduce-scatter, so `optim` holds as little as
`optim_grads`; Megatron's double buffer, bucketing and NCCL user buffers have no counterpart.
Mixed precision: the sharded params stay fp32 (the optimizer's main params); bf16 copies are
gathered for compute (`MixedPrecisionPolicy.param_dtype`); grads reduce in
`megatron_fsdp_grad_comm_dtype`, else `megatron_fsdp_main_grads_dtype`, else fp32 with
`grad_reduce_in_fp32`, else the compute dtype.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from gigatron.core import parallel_state as ps
from gigatron.core.distributed.fsdp.sharded_state_dict import fsdp_sharded_state_dict
from gigatron.core.transformer.transformer_layer import TransformerLayer

SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")

# Attributes FSDP2 must not carry over from the plain param to its DTensor: DDP's grad state.
_SKIPPED_ATTRS = ("main_grad", "grad_added_to_main_grad", "main_grad_is_zero")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (sharing its storage), else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def data_parallel_mesh(dp_group, *, replicate: bool) -> DeviceMesh:
    """1-D mesh over `dp_group` (shard), or 2-D (replicate over `dp_group`, shard over this
    rank alone) for `no_shard`."""
    device = "cuda" if dist.get_backend(dp_group) == "nccl" else "cpu"
    ranks = dist.get_process_group_ranks(dp_group)
    # Meshes compare equal by ranks and dim names, and DTensor's sharding cache hands back
    # specs holding the first equal mesh it met: after the groups are rebuilt (a new
    # initialize_model_parallel), a new model's params would carry a mesh of destroyed groups.
    # The group's name in the dim names keeps meshes of different groups apart.
    tag = dp_group.group_name
    if not replicate:
        return DeviceMesh.from_group(dp_group, device, mesh_dim_names=(f"dp_shard_{tag}",))
    alone = dist.new_group([dist.get_rank()], use_local_synchronization=True)
    return DeviceMesh.from_group(
        [dp_group, alone],
        device,
        mesh=torch.tensor(ranks).view(-1, 1),
        mesh_dim_names=(f"dp_replicate_{tag}", f"dp_shard_{tag}"),
    )


def mixed_precision_policy(config, ddp_config) -> MixedPrecisionPolicy:
    """FSDP2's policy from Megatron's flags (module doc)."""
    compute = torch.bfloat16 if getattr(config, "bf16", False) else None
    reduce = ddp_config.megatron_fsdp_grad_comm_dtype or ddp_config.megatron_fsdp_main_grads_dtype
    if reduce is None and ddp_config.grad_reduce_in_fp32:
        reduce = torch.float32
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)


def _units(module: torch.nn.Module, unit_types: tuple) -> list[torch.nn.Module]:
    """Outermost submodules of `unit_types` (not the root), in module order."""
    found: list[torch.nn.Module] = []

    def visit(m: torch.nn.Module) -> None:
        for child in m.children():
            if isinstance(child, unit_types):
                found.append(child)
            else:
                visit(child)

    visit(module)
    return found


def shard_module(
    module: torch.nn.Module,
    *,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    reshard_after_forward: bool | int,
    unit_types: tuple = (TransformerLayer,),
) -> list[torch.nn.Module]:
    """`fully_shard` each unit, then the root; keep the params' Megatron attributes
    (`tensor_model_parallel`, `sequence_parallel`, `shared`, `allreduce`, ...) on the DTensor
    params. Returns the FSDP modules, root last."""
    saved = {
        name: {k: v for k, v in vars(p).items() if k not in _SKIPPED_ATTRS}
        for name, p in module.named_parameters()
    }
    kwargs = dict(mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    units = _units(module, tuple(unit_types))
    for unit in units:
        fully_shard(unit, **kwargs)
    # the root's params are gathered by the last backward anyway: keep them for it
    fully_shard(module, **{**kwargs, "reshard_after_forward": False})
    for name, p in module.named_parameters():
        vars(p).update(saved.get(name, {}))
    return [*units, module]


class FullyShardedModule(torch.nn.Module):
    """What the training loop asks of a data-parallel wrapper (DDP's methods), over an
    FSDP2-sharded `module`. Subclasses pick the mesh and resharding (module doc)."""

    wraps_model = True  # core.utils.unwrap_model follows .module
    is_fully_sharded = True  # get_megatron_optimizer steps the DTensor shards

    def __init__(
        self,
        config,
        ddp_config,
        module: torch.nn.Module,
        *,
        dp_group,
        strategy: str,
        reshard_after_forward: bool | int,
        unit_types: tuple,
    ):
        super().__init__()
        if strategy not in SHARDING_STRATEGIES:
            raise ValueError(
                f"data_parallel_sharding_strategy ({strategy!r}) must be one of "
                f"{', '.join(SHARDING_STRATEGIES)}"
            )
        for name, p in module.named_parameters():
            if p.requires_grad and not getattr(p, "allreduce", True) and _expert_dp_differs():
                raise ValueError(
                    f"fully sharded data parallel: expert param {name} would need the "
                    "expert-data-parallel mesh; expert_model_parallel_size > 1 (or an expert "
                    "TP size unlike TP) is not supported with FSDP in gigatron"
                )
        self.config = config
        self.ddp_config = ddp_config
        self.data_parallel_sharding_strategy = strategy
        self.dp_cp_group = dp_group
        self.mesh = data_parallel_mesh(dp_group, replicate=strategy == "no_shard")
        self.module = module
        self.fsdp_modules = shard_module(
            module,
            mesh=self.mesh,
            mp_policy=mixed_precision_policy(config, ddp_config),
            reshard_after_forward=reshard_after_forward,
            unit_types=unit_types,
        )
        if getattr(config, "calculate_per_token_loss", False):
            for m in self.fsdp_modules:  # sum: finalize_model_grads divides by the tokens
                m.set_gradient_divide_factor(1.0)
        # DDP's attributes other code reads: no flat buffers here
        self.buffers, self.expert_parallel_buffers = [], []

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def local_grads(self) -> list[torch.Tensor]:
        """This rank's grad shards (plain tensors)."""
        return [local_tensor(p.grad) for p in self.module.parameters() if p.grad is not None]

    @contextmanager
    def no_sync(self):
        """Accumulate unsharded grads without the reduce-scatter (all microbatches but the
        last)."""
        root: FSDPModule = self.module
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    def zero_grad_buffer(self) -> None:
        """Drop the grads (FSDP2 has no flat buffer to zero)."""
        for p in self.module.parameters():
            p.grad = None

    def start_grad_sync(self, *unused) -> None:
        """Nothing: FSDP2 reduce-scatters each unit's grads during backward."""

    def finish_grad_sync(self, force_all_reduce: bool | None = False) -> None:
        """Nothing: the root's backward waits for the last reduce-scatter."""

    def start_param_sync(self, *unused, force_sync: bool = False, force_dispatch: bool = False):
        """Nothing: each unit all-gathers its params in its forward pre-hook."""

    def scale_gradients(self, scaling_factor: float) -> None:
        """Multiply every grad shard by `scaling_factor`."""
        grads = self.local_grads()
        if grads:
            torch._foreach_mul_(grads, scaling_factor)

    def broadcast_params(self) -> None:
        """Nothing to send: the shards were cut from the same full params on every rank."""

    def state_dict(self, *args, **kwargs):
        """The bare module's keys; values are DTensors (full shape, this rank's shard)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        return self.module.load_state_dict(state_dict, strict=strict)

    def sharded_state_dict(self, *args, **kwargs):
        """The bare module's checkpoint entries cut to this rank's rows: the same global
        tensors as under DDP (`sharded_state_dict.py`)."""
        return fsdp_sharded_state_dict(
            self.module.sharded_state_dict(*args, **kwargs),
            sharded=self.data_parallel_sharding_strategy != "no_shard",
        )


def _expert_dp_differs() -> bool:
    if not ps.model_parallel_is_initialized():
        return False
    return ps.get_expert_data_parallel_group() is not ps.get_data_parallel_group(
        with_context_parallel=True
    ) and dist.get_process_group_ranks(
        ps.get_expert_data_parallel_group()
    ) != dist.get_process_group_ranks(ps.get_data_parallel_group(with_context_parallel=True))
