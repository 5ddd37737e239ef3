"""Megatron's `optimizer.param_layout`: where each param sits in DDP's flat buffers (defined in
`gigatron.core._param_layout`, below both `core.distributed` and `core.optimizer`)."""

from gigatron.core._param_layout import (  # noqa: F401  (Megatron's names here)
    PARAM_START_ALIGNMENT,
    BufferKey,
    FullParamLayout,
    PerBufferParamLayout,
    bucket_end_divisor,
    pad_bucket_end,
    pad_param_start,
    pad_to_divisor,
)
