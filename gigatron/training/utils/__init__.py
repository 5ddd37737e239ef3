"""Helpers of the training loop (mirrors the `megatron.training.utils` package).

`common_utils`: rank-aware printing, reductions, argument helpers; `log_utils`: logging levels,
filters and the progress log. Their public names are re-exported here, as Megatron does.
"""

from gigatron.training.utils.common_utils import (
    PARALLEL_SIZE_FLAGS,
    args_by_name,
    average_losses_across_data_parallel_group,
    calc_params_l2_norm,
    get_blend_and_blend_per_split,
    get_device_arch_version,
    get_local_rank_preinit,
    is_first_or_last_pipeline_stage,
    is_hybrid_model,
    is_last_rank,
    is_rank0,
    logical_and_across_model_parallel_group,
    print_rank_0,
    print_rank_last,
    reduce_max_stat_across_model_parallel_group,
    to_empty_if_meta_device,
    update_use_dist_ckpt,
    warn_rank_0,
)
from gigatron.training.utils.log_utils import append_to_progress_log

__all__ = [
    "PARALLEL_SIZE_FLAGS",
    "args_by_name",
    "append_to_progress_log",
    "average_losses_across_data_parallel_group",
    "calc_params_l2_norm",
    "get_blend_and_blend_per_split",
    "get_device_arch_version",
    "get_local_rank_preinit",
    "is_first_or_last_pipeline_stage",
    "is_hybrid_model",
    "is_last_rank",
    "is_rank0",
    "logical_and_across_model_parallel_group",
    "print_rank_0",
    "print_rank_last",
    "reduce_max_stat_across_model_parallel_group",
    "to_empty_if_meta_device",
    "update_use_dist_ckpt",
    "warn_rank_0",
]
