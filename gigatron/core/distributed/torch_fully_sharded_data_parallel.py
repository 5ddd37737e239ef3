"""`TorchFullyShardedDataParallel` (`--use-torch-fsdp2`): mirrors
`megatron.core.distributed.torch_fully_sharded_data_parallel`. PyTorch's `fully_shard` over the
data-parallel (x context-parallel) group, each TransformerLayer one unit plus the root
(`fsdp/fully_shard.py`). Megatron's limits apply (no PP, no EP, no distributed optimizer:
checked by `gigatron train`'s argument validation)."""

from __future__ import annotations

import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed.fsdp.fully_shard import FullyShardedModule
from gigatron.core.transformer.transformer_layer import TransformerLayer


class TorchFullyShardedDataParallel(FullyShardedModule):
    """Fully shard `module` (optimizer state, grads and params: ZeRO-3) with FSDP2;
    `ddp_config.reshard_after_forward` as in `fully_shard`."""

    def __init__(
        self,
        config,
        ddp_config,
        module: torch.nn.Module,
        sub_modules_to_wrap=(TransformerLayer,),
        disable_bucketing: bool = False,
        process_group=None,
    ):
        dp_group = process_group or ps.get_data_parallel_group(with_context_parallel=True)
        super().__init__(
            config,
            ddp_config,
            module,
            dp_group=dp_group,
            strategy="optim_grads_params",
            reshard_after_forward=getattr(ddp_config, "reshard_after_forward", True),
            unit_types=tuple(sub_modules_to_wrap),
        )
