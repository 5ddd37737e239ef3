"""Settings of `DistributedDataParallel`; mirrors
`megatron.core.distributed.distributed_data_parallel_config`.

Same field names and defaults as Megatron. Fields for features gigatron does not implement
(Megatron-FSDP's double buffer, FP8/MXFP8 param gather, NCCL user buffers, partial distributed
optimizer, ...) are accepted at their defaults and raise ValueError when set to anything else.
Megatron-FSDP's strategy and dtypes run on FSDP2 (`fsdp/fully_shard.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_FILE = "gigatron/core/distributed/distributed_data_parallel_config.py"


@dataclass
class DistributedDataParallelConfig:
    """Configuration for DistributedDataParallel."""

    grad_reduce_in_fp32: bool = False
    """Keep the grad buffer (main_grad) in fp32 and reduce in fp32 (bf16/fp16 models)."""

    overlap_grad_reduce: bool = False
    """Launch each bucket's all-reduce / reduce-scatter asynchronously during backward."""

    overlap_param_gather: bool = False
    """With the distributed optimizer: all-gather params asynchronously, waited on per module
    by forward pre-hooks."""

    align_param_gather: bool = False
    """All PP stages launch param all-gathers together (gigatron dispatches all buckets at once
    in start_param_sync either way)."""

    use_distributed_optimizer: bool = False
    """Reduce-scatter grads (each DP rank owns a shard) and keep a contiguous param buffer."""

    num_distributed_optimizer_instances: int = 1
    """Partial distributed optimizer (shard inside DP sub-groups). Only 1 is supported."""

    check_for_nan_in_grad: bool = False
    """Raise if a grad holds NaN/Inf before the DP collective."""

    check_for_large_grads: bool = False
    """Megatron's large-grad detector (not implemented; must be False)."""

    bucket_size: int | None = None
    """Params per bucket (a bucket closes at the first param reaching it); None -> max(40M,
    1M * dp). Ignored (one bucket per buffer) unless overlap_grad_reduce. A bucket's collective
    starts once all its params have grads, so on small models the default leaves few buckets
    (gpt-125m: 3, the second ready only at the end of backward): about one layer's params
    overlaps best (docs/ddp_overlap.md)."""

    pad_buckets_for_high_nccl_busbw: bool = False
    """Pad bucket sizes to a multiple of 2**16 (distributed optimizer)."""

    reduce_scatter_with_fp32_accumulation: bool = False
    """Low-precision wire / fp32 accumulate reduce-scatter (not implemented; must be False)."""

    average_in_collective: bool = False
    """Average in the collective (ReduceOp.AVG) instead of pre-scaling grads by 1/dp."""

    fp8_param_gather: bool = False
    """FP8 params all-gather (not implemented; must be False)."""

    reuse_grad_buf_for_mxfp8_param_ag: bool = False
    """MXFP8 only (not implemented; must be False)."""

    use_megatron_fsdp: bool = False
    """Wrap the model in FullyShardedDataParallel (gigatron: on PyTorch's FSDP2)."""

    use_custom_fsdp: bool = False
    """Deprecated alias of use_megatron_fsdp."""

    megatron_fsdp_version: int = 1
    """Megatron-FSDP implementation, 1 or 2 (gigatron: the same FSDP2 engine for both)."""

    data_parallel_sharding_strategy: str = "no_shard"
    """With use_megatron_fsdp: no_shard | optim | optim_grads | optim_grads_params (ZeRO-0 to
    ZeRO-3; docs/fsdp.md)."""

    gradient_reduce_div_fusion: bool = True
    """FSDP knob; no effect here."""

    suggested_communication_unit_size: int | None = None
    """FSDP knob; no effect here."""

    preserve_fp32_weights: bool = True
    """FSDP knob; no effect here."""

    keep_fp8_transpose_cache: bool = False
    """FP8 knob; must be False."""

    nccl_ub: bool = False
    """NCCL user buffers (CUDA only; must be False)."""

    fsdp_double_buffer: bool = False
    """FSDP knob; must be False."""

    outer_dp_sharding_strategy: str = "no_shard"
    """HSDP knob; only 'no_shard'."""

    disable_symmetric_registration: bool = False
    """NCCL symmetric memory knob; no effect here."""

    fsdp_manual_registration: bool = False
    """FSDP knob; must be False."""

    delay_wgrad_compute: bool = False
    """Split dgrad/wgrad (not implemented; must be False)."""

    # added in megatron-core 0.19, accepted at their defaults only
    num_buckets: int | None = None
    """Bucket count instead of bucket_size (not implemented; must be None)."""

    param_name_patterns_for_fp32_local_accumulation: tuple = ()
    """Per-parameter fp32 grad accumulation (not implemented; must be empty)."""

    fp4_param_gather: bool = False
    """FP4 params all-gather (not implemented; must be False)."""

    fsdp_db_use_persist_buf_on_alloc_fail: bool = False
    """FSDP knob; must be False."""

    fsdp_all_gather_in_start_param_sync: bool = True
    """FSDP knob; no effect here."""

    megatron_fsdp_main_params_dtype: Any = torch.float32
    """Megatron-FSDP knob; must be torch.float32."""

    megatron_fsdp_main_grads_dtype: Any = None
    """Megatron-FSDP: dtype grads are reduced in when megatron_fsdp_grad_comm_dtype is None
    (torch.float32 / torch.bfloat16; None: the compute dtype, fp32 with grad_reduce_in_fp32);
    the sharded grads the optimizer reads are fp32."""

    megatron_fsdp_grad_comm_dtype: Any = None
    """Megatron-FSDP: dtype of the grad reduce-scatter (None: as megatron_fsdp_main_grads_dtype)."""

    megatron_fsdp_use_decoupled_grad: bool = False
    """Megatron-FSDP knob; must be False."""

    megatron_fsdp_cuda_graph_mode: bool = False
    """Megatron-FSDP knob; must be False."""

    megatron_fsdp_enable_fine_grained_param_gather: bool = False
    """Megatron-FSDP knob; must be False."""

    megatron_fsdp_max_pool_double_buffer: bool = False
    """Megatron-FSDP knob; must be False."""

    def __post_init__(self) -> None:
        must_be = {
            "num_distributed_optimizer_instances": 1,
            "check_for_large_grads": False,
            "reduce_scatter_with_fp32_accumulation": False,
            "fp8_param_gather": False,
            "reuse_grad_buf_for_mxfp8_param_ag": False,
            "keep_fp8_transpose_cache": False,
            "nccl_ub": False,
            "fsdp_double_buffer": False,
            "outer_dp_sharding_strategy": "no_shard",
            "fsdp_manual_registration": False,
            "delay_wgrad_compute": False,
            "num_buckets": None,
            "fp4_param_gather": False,
            "fsdp_db_use_persist_buf_on_alloc_fail": False,
            "megatron_fsdp_main_params_dtype": torch.float32,
            "megatron_fsdp_use_decoupled_grad": False,
            "megatron_fsdp_cuda_graph_mode": False,
            "megatron_fsdp_enable_fine_grained_param_gather": False,
            "megatron_fsdp_max_pool_double_buffer": False,
        }
        for name, allowed in must_be.items():
            value = getattr(self, name)
            if value != allowed:
                raise ValueError(
                    f"DistributedDataParallelConfig.{name} ({value!r}) is not supported by "
                    f"gigatron; it must be {allowed!r} ({_FILE})"
                )
        self._check_fsdp()
        if tuple(self.param_name_patterns_for_fp32_local_accumulation):
            raise ValueError(
                "DistributedDataParallelConfig.param_name_patterns_for_fp32_local_accumulation "
                f"({self.param_name_patterns_for_fp32_local_accumulation!r}) is not supported by "
                f"gigatron; it must be empty ({_FILE})"
            )
        if self.bucket_size is not None and self.bucket_size <= 0:
            raise ValueError(
                f"DistributedDataParallelConfig.bucket_size ({self.bucket_size}) must be positive "
                f"or None ({_FILE})"
            )
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ValueError(
                "DistributedDataParallelConfig.overlap_param_gather (True) requires "
                "use_distributed_optimizer=True: only its params are gathered (gigatron refuses "
                f"it here, Megatron in its arguments) ({_FILE})"
            )

    def _check_fsdp(self) -> None:
        """Megatron-FSDP's fields: the strategy and dtypes named, the version 1 or 2."""
        strategies = ("no_shard", "optim", "optim_grads", "optim_grads_params")
        if self.data_parallel_sharding_strategy not in strategies:
            raise ValueError(
                "DistributedDataParallelConfig.data_parallel_sharding_strategy "
                f"({self.data_parallel_sharding_strategy!r}) must be one of {strategies}"
            )
        if self.megatron_fsdp_version not in (1, 2):
            raise ValueError(
                f"DistributedDataParallelConfig.megatron_fsdp_version "
                f"({self.megatron_fsdp_version!r}) must be 1 or 2"
            )
        for name in ("megatron_fsdp_main_grads_dtype", "megatron_fsdp_grad_comm_dtype"):
            value = getattr(self, name)
            if value not in (None, torch.float32, torch.bfloat16):
                raise ValueError(
                    f"DistributedDataParallelConfig.{name} ({value!r}) must be None, "
                    "torch.float32 or torch.bfloat16 in gigatron (fp16 is not supported with "
                    "FSDP)"
                )
