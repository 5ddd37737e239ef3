"""Tensor parallelism: Megatron's `megatron.core.tensor_parallel` in plain PyTorch.

Layers that split weights over the tensor-parallel group, the autograd collectives between them,
vocabulary-parallel cross entropy, named RNG streams with activation checkpointing, and a few
splitting helpers. Everything runs on gloo (CPU) as well as NCCL.
"""

from gigatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from gigatron.core.tensor_parallel.data import broadcast_data
from gigatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_tensor_model_parallel_attributes,
    linear_with_grad_accumulation_and_async_allreduce,
    param_is_not_tensor_parallel_duplicate,
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from gigatron.core.tensor_parallel.mappings import (
    all_gather_last_dim_from_tensor_parallel_region,
    all_to_all,
    all_to_all_hp2sp,
    all_to_all_sp2hp,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_last_dim_to_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from gigatron.core.tensor_parallel.random import (
    CheckpointWithoutOutput,
    checkpoint,
    convert_cuda_rng_state,
    get_cuda_rng_tracker,
    get_data_parallel_rng_tracker_name,
    get_expert_parallel_rng_tracker_name,
    is_graph_safe_cuda_rng_tracker,
    model_parallel_cuda_manual_seed,
)
from gigatron.core.tensor_parallel.utils import (
    VocabUtility,
    gather_split_1d_tensor,
    split_tensor_along_last_dim,
    split_tensor_into_1d_equal_chunks,
)

__all__ = [
    # cross_entropy.py
    "vocab_parallel_cross_entropy",
    # data.py
    "broadcast_data",
    # layers.py
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "set_tensor_model_parallel_attributes",
    "set_defaults_if_not_set_tensor_model_parallel_attributes",
    "copy_tensor_model_parallel_attributes",
    "param_is_not_tensor_parallel_duplicate",
    "linear_with_grad_accumulation_and_async_allreduce",
    # mappings.py
    "copy_to_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "scatter_to_sequence_parallel_region",
    "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "all_gather_last_dim_from_tensor_parallel_region",
    "reduce_scatter_last_dim_to_tensor_parallel_region",
    "all_to_all",
    "all_to_all_sp2hp",
    "all_to_all_hp2sp",
    # random.py
    "checkpoint",
    "CheckpointWithoutOutput",
    "convert_cuda_rng_state",
    "get_cuda_rng_tracker",
    "get_data_parallel_rng_tracker_name",
    "get_expert_parallel_rng_tracker_name",
    "is_graph_safe_cuda_rng_tracker",
    "model_parallel_cuda_manual_seed",
    # utils.py
    "VocabUtility",
    "split_tensor_along_last_dim",
    "split_tensor_into_1d_equal_chunks",
    "gather_split_1d_tensor",
]
