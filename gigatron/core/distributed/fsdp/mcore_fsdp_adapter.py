"""`FullyShardedDataParallel`: Megatron-FSDP's wrapper factory (`megatron.core.distributed.fsdp.
mcore_fsdp_adapter`) with `DistributedDataParallelConfig.data_parallel_sharding_strategy`,
on PyTorch's FSDP2 (`fully_shard.py` has the mapping and where it differs from Megatron-FSDP).
Megatron's two implementations (`megatron_fsdp_version` 1 and 2) are one engine here."""

from __future__ import annotations

import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed.fsdp.fully_shard import FullyShardedModule
from gigatron.core.transformer.transformer_layer import TransformerLayer


class FullyShardedDataParallelV1(FullyShardedModule):
    """Shard `module` over the data-parallel (x context-parallel) group; one FSDP unit per
    `fsdp_unit_modules` match (default: each TransformerLayer) plus the root.

    `optim_grads_params` reshards the params after each unit's forward (ZeRO-3); `optim` and
    `optim_grads` keep them gathered from forward to backward; `no_shard` replicates them."""

    def __init__(
        self,
        config,
        ddp_config,
        module: torch.nn.Module,
        fsdp_unit_modules: list | None = None,
        disable_bucketing: bool = False,
        device: torch.device | None = None,
        pg_collection=None,
    ):
        if not (ddp_config.use_megatron_fsdp or ddp_config.use_custom_fsdp):
            raise ValueError(
                "FullyShardedDataParallel needs DistributedDataParallelConfig.use_megatron_fsdp"
                " = True"
            )
        dp_group = (
            pg_collection.dp_cp
            if pg_collection is not None
            else ps.get_data_parallel_group(with_context_parallel=True)
        )
        strategy = ddp_config.data_parallel_sharding_strategy
        super().__init__(
            config,
            ddp_config,
            module,
            dp_group=dp_group,
            strategy=strategy,
            reshard_after_forward=strategy == "optim_grads_params",
            unit_types=tuple(fsdp_unit_modules or (TransformerLayer,)),
        )


class FullyShardedDataParallelV2(FullyShardedDataParallelV1):
    """`megatron_fsdp_version=2`: the same FSDP2 engine as version 1."""


def FullyShardedDataParallel(  # noqa: N802  (Megatron's factory name)
    config,
    ddp_config,
    module: torch.nn.Module,
    fsdp_unit_modules: list | None = None,
    disable_bucketing: bool = False,
    device: torch.device | None = None,
    pg_collection=None,
) -> FullyShardedDataParallelV1:
    """The wrapper `ddp_config.megatron_fsdp_version` names (a factory, as in Megatron)."""
    cls = (
        FullyShardedDataParallelV2
        if ddp_config.megatron_fsdp_version == 2
        else (FullyShardedDataParallelV1)
    )
    return cls(
        config, ddp_config, module, fsdp_unit_modules, disable_bucketing, device, pg_collection
    )
