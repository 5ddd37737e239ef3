"""Tensor-parallel linear and embedding layers.

Mirrors `megatron.core.tensor_parallel.layers` (Megatron-LM paper, arXiv:1909.08053, section 3):
`ColumnParallelLinear` splits the output features over TP ranks, `RowParallelLinear` the input
features, `VocabParallelEmbedding` the vocabulary. Linear layers return `(output, bias)`; the bias
comes back un-added only with `skip_bias_add=True`.

Each layer's `sharded_state_dict` is Megatron's: the TP-split weight (and column bias) as
ShardedTensors over the TP group (the embedding with `allow_shape_mismatch`, so a padded
vocabulary can change), the rest TP-replicated, `_extra_state` as a ShardedObject.

Shapes: s: sequence, b: micro-batch, h: input features, o: output features, tp: TP group size.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.parameter import Parameter

from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel._linear import (
    LinearReduceScatterOverlapped,
    LinearWithGradAccumulationAndAsyncCommunication,
    linear_with_grad_accumulation_and_async_allreduce,
)
from gigatron.core.tensor_parallel._param_init import (
    _initialize_affine_weight_cpu,
    _initialize_affine_weight_gpu,
    copy_tensor_model_parallel_attributes,
    param_is_not_tensor_parallel_duplicate,
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from gigatron.core.tensor_parallel.fp8_delayed import load_extra, state_to_extra
from gigatron.core.tensor_parallel.fp8_linear import Fp8LinearFunction, delayed_args
from gigatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from gigatron.core.tensor_parallel.utils import VocabUtility
from gigatron.core.tensor_parallel.wgrad import WGRAD_GEMM_ACCUM_FP32, WGRAD_IN_MAIN_GRAD
from gigatron.core.utils import (
    get_tensor_model_parallel_group_if_none,
    group_rank,
    group_size,
    make_sharded_tensors_for_checkpoint,
    make_tp_sharded_tensor_for_checkpoint,
    parameter_device,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "LinearWithGradAccumulationAndAsyncCommunication",
    "linear_with_grad_accumulation_and_async_allreduce",
    "param_is_not_tensor_parallel_duplicate",
    "set_tensor_model_parallel_attributes",
    "set_defaults_if_not_set_tensor_model_parallel_attributes",
    "copy_tensor_model_parallel_attributes",
]


def _resolve_group(tp_group, pg_collection, is_expert: bool):
    if tp_group is None and pg_collection is not None:
        tp_group = getattr(pg_collection, "expt_tp" if is_expert else "tp", None)
    return get_tensor_model_parallel_group_if_none(tp_group, is_expert=is_expert)


def _per_rank(size: int, tp_size: int, field: str, cls: str) -> int:
    if size % tp_size != 0:
        raise ValueError(
            f"{cls}: {field} ({size}) must be divisible by the tensor-parallel size ({tp_size})"
        )
    return size // tp_size


def _mark_wgrad_fusion(weight: Parameter, config: ModelParallelConfig) -> None:
    """gradient_accumulation_fusion: this layer's backward adds dW into `weight.main_grad`
    whenever DDP gave it one; DDP's hook reads the mark (tensor_parallel/wgrad.py), the
    backward reads whether its GEMM may accumulate in fp32 (`wgrad_gemm_accum_fp32`)."""
    if config.gradient_accumulation_fusion:
        setattr(weight, WGRAD_IN_MAIN_GRAD, True)
        setattr(weight, WGRAD_GEMM_ACCUM_FP32, config.wgrad_gemm_accum_fp32)


def _param_device(config: ModelParallelConfig) -> torch.device:
    return parameter_device(config)


def _default_extra_state(state_dict, prefix, *args) -> None:
    """Load pre-hook: a state dict without this layer's `_extra_state` (megatron-core's GPTModel
    leaves the output layer's out of its checkpoints) loads as if it held None, as in Megatron."""
    state_dict.setdefault(f"{prefix}_extra_state")


class _ExtraStateMixin:
    """An empty `_extra_state` entry in the state dict, as Transformer Engine layers have, and
    the linear layers' `sharded_state_dict`: `_TP_AXES` {name: axis} are split over TP."""

    _TP_AXES: dict[str, int] = {}

    def get_extra_state(self):
        """None, or under FP8 delayed scaling the amax history and scales (TE's keys)."""
        state = getattr(self, "fp8_state", None)
        return None if state is None else state_to_extra(state)

    def set_extra_state(self, state) -> None:
        if getattr(self, "fp8_state", None) is not None:
            load_extra(self.fp8_state, state)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            self._TP_AXES,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )


class ColumnParallelLinear(_ExtraStateMixin, torch.nn.Module):
    """`Y = X A + b` with A split along its output dim: rank r holds `A[:, r*o/tp:(r+1)*o/tp]`.

    Weight `[o/tp, h]` (nn.Linear layout), bias `[o/tp]`. Input `[s, b, h]` (`[s/tp, b, h]` under
    sequence parallel); output `[s, b, o/tp]`, or `[s, b, o]` with `gather_output`.
    """

    _TP_AXES = {"weight": 0, "bias": 0}

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config: ModelParallelConfig,
        init_method: Callable,
        bias: bool = True,
        gather_output: bool = False,
        stride: int = 1,
        keep_master_weight_for_test: bool = False,
        skip_bias_add: bool = False,
        skip_weight_param_allocation: bool = False,
        embedding_activation_buffer: list | None = None,
        grad_output_buffer: list | None = None,
        is_expert: bool = False,
        tp_comm_buffer_name: str | None = None,  # accepted; used by TE comm overlap only
        disable_grad_reduce: bool = False,
        tp_group=None,
        name: str | None = None,
        output_dtype: torch.dtype | None = None,
        pg_collection=None,
    ):
        super().__init__()
        self._register_load_state_dict_pre_hook(_default_extra_state)
        if output_dtype is not None:
            raise ValueError(
                f"ColumnParallelLinear: output_dtype={output_dtype} is not supported by gigatron"
            )
        self.config = config
        self.input_size, self.output_size = input_size, output_size
        self.gather_output = gather_output
        self.skip_bias_add = skip_bias_add
        self.is_expert = is_expert
        self.expert_parallel = config.expert_model_parallel_size > 1
        self.disable_grad_reduce = disable_grad_reduce
        self.tp_comm_buffer_name = tp_comm_buffer_name
        self.name = name
        self.embedding_activation_buffer = embedding_activation_buffer
        self.grad_output_buffer = grad_output_buffer
        self.tp_group = _resolve_group(tp_group, pg_collection, is_expert)
        tp_size, tp_rank = group_size(self.tp_group), group_rank(self.tp_group)
        self.output_size_per_partition = _per_rank(
            output_size, tp_size, "output_size", "ColumnParallelLinear"
        )
        self.explicit_expert_comm = is_expert and (tp_size > 1 or self.expert_parallel)
        self.master_weight = None
        device, dtype = _param_device(config), config.params_dtype

        if not skip_weight_param_allocation:
            self.weight = Parameter(
                torch.empty(self.output_size_per_partition, input_size, device=device, dtype=dtype)
            )
            set_tensor_model_parallel_attributes(self.weight, True, 0, stride)
            if config.perform_initialization:
                if config.use_cpu_initialization:
                    self.master_weight = _initialize_affine_weight_cpu(
                        self.weight,
                        output_size,
                        input_size,
                        self.output_size_per_partition,
                        0,
                        init_method,
                        stride=stride,
                        return_master_weight=keep_master_weight_for_test,
                        params_dtype=dtype,
                        rank=tp_rank,
                        world_size=tp_size,
                    )
                else:
                    _initialize_affine_weight_gpu(self.weight, init_method, 0, stride, is_expert)
            self.weight.allreduce = not (is_expert and self.expert_parallel)
            _mark_wgrad_fusion(self.weight, config)
        else:
            self.weight = None

        if bias:
            self.bias = Parameter(
                torch.empty(self.output_size_per_partition, device=device, dtype=dtype)
            )
            set_tensor_model_parallel_attributes(self.bias, True, 0, stride)
            if config.perform_initialization:
                with torch.no_grad():
                    self.bias.zero_()
            self.bias.allreduce = not (is_expert and self.expert_parallel)
        else:
            self.register_parameter("bias", None)

        self.sequence_parallel = config.sequence_parallel
        if self.sequence_parallel and tp_size <= 1:
            warnings.warn(
                f"sequence_parallel is True but the tensor-parallel size is {tp_size}; "
                "disabling sequence parallel",
                stacklevel=2,
            )
            self.sequence_parallel = False
        self.allreduce_dgrad = (
            tp_size > 1 and not self.sequence_parallel and not disable_grad_reduce
        )
        self.gradient_accumulation_fusion = config.gradient_accumulation_fusion
        # gigatron.core.fp8_utils.Fp8Recipe: run the GEMMs in FP8 (set by the transformer block)
        self.fp8_recipe = None
        self.fp8_state = None  # tensor_parallel.fp8_delayed.Fp8DelayedState (delayed scaling)

    def forward(
        self,
        input_: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[s, b, h]` (`[s/tp, b, h]` under SP) -> `([s, b, o/tp] or [s, b, o], bias or None)`.

        `weight` must be given when the layer was built with `skip_weight_param_allocation`
        (shape `[o/tp, h]`); `runtime_gather_output` overrides `gather_output` for this call.
        """
        if weight is None:
            if self.weight is None:
                raise ValueError(
                    "ColumnParallelLinear: weight must be passed to forward when "
                    "skip_weight_param_allocation=True"
                )
            weight = self.weight
        else:
            expected = (self.output_size_per_partition, self.input_size)
            if tuple(weight.shape) != expected:
                raise ValueError(
                    f"ColumnParallelLinear: supplied weight shape {tuple(weight.shape)} must be "
                    f"{expected} ([output_size / tp, input_size])"
                )
        bias = self.bias if not self.skip_bias_add else None
        gather_output = (
            self.gather_output if runtime_gather_output is None else runtime_gather_output
        )
        if gather_output and self.sequence_parallel:
            raise ValueError(
                "ColumnParallelLinear: gather_output=True cannot be used with sequence_parallel"
            )

        plain_input = (
            self.allreduce_dgrad
            or self.sequence_parallel
            or self.explicit_expert_comm
            or self.disable_grad_reduce
        )
        # The input-gradient all-reduce happens inside the linear function when allreduce_dgrad.
        input_parallel = (
            input_ if plain_input else copy_to_tensor_model_parallel_region(input_, self.tp_group)
        )
        allreduce_dgrad = False if self.explicit_expert_comm else self.allreduce_dgrad
        sequence_parallel = False if self.explicit_expert_comm else self.sequence_parallel
        if self.fp8_recipe is not None:
            multi_rank = group_size(self.tp_group) > 1
            output_parallel = Fp8LinearFunction.apply(
                input_parallel, weight, bias, self.fp8_recipe, "column",
                self.gradient_accumulation_fusion, allreduce_dgrad and multi_rank,
                sequence_parallel and multi_rank, self.tp_group, delayed_args(self.fp8_state),
            )  # fmt: skip
        else:
            output_parallel = linear_with_grad_accumulation_and_async_allreduce(
                input=input_parallel,
                weight=weight,
                bias=bias,
                gradient_accumulation_fusion=self.gradient_accumulation_fusion,
                allreduce_dgrad=allreduce_dgrad,
                sequence_parallel=sequence_parallel,
                tp_group=self.tp_group,
                tp_comm_overlap=bool(getattr(self.config, "tp_comm_overlap", False)),
            )  # [s, b, o/tp]

        if gather_output:
            output = gather_from_tensor_model_parallel_region(output_parallel, self.tp_group)
        else:
            output = output_parallel
        return output, (self.bias if self.skip_bias_add else None)

    def __repr__(self) -> str:
        tp = group_size(self.tp_group)
        return (
            f"{type(self).__name__}(in_features={self.input_size}, "
            f"out_features={self.output_size}, bias={self.bias is not None}, TP={tp})"
        )


class RowParallelLinear(_ExtraStateMixin, torch.nn.Module):
    """`Y = X A + b` with A split along its input dim: rank r holds `A[r*h/tp:(r+1)*h/tp, :]`.

    Weight `[o, h/tp]`, bias `[o]` (not split; added after the reduction). Input `[s, b, h/tp]`
    (or `[s, b, h]`, split here, when not `input_is_parallel`); output `[s, b, o]`, or
    `[s/tp, b, o]` (reduce-scattered) under sequence parallel.
    """

    _TP_AXES = {"weight": 1}  # the bias is whole on every rank

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config: ModelParallelConfig,
        init_method: Callable,
        bias: bool,
        input_is_parallel: bool,
        skip_bias_add: bool,
        stride: int = 1,
        keep_master_weight_for_test: bool = False,
        is_expert: bool = False,
        tp_comm_buffer_name: str | None = None,  # accepted; used by TE comm overlap only
        tp_group=None,
        name: str | None = None,
        pg_collection=None,
    ):
        super().__init__()
        self._register_load_state_dict_pre_hook(_default_extra_state)
        self.config = config
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel = input_is_parallel
        self.skip_bias_add = skip_bias_add
        self.is_expert = is_expert
        self.expert_parallel = config.expert_model_parallel_size > 1
        self.tp_comm_buffer_name = tp_comm_buffer_name
        self.name = name
        self.gradient_accumulation_fusion = config.gradient_accumulation_fusion
        self.sequence_parallel = config.sequence_parallel
        if self.sequence_parallel and not input_is_parallel:
            raise ValueError(
                "RowParallelLinear: sequence_parallel=True requires input_is_parallel=True "
                "(got input_is_parallel=False)"
            )
        self.tp_group = _resolve_group(tp_group, pg_collection, is_expert)
        tp_size, tp_rank = group_size(self.tp_group), group_rank(self.tp_group)
        self.input_size_per_partition = _per_rank(
            input_size, tp_size, "input_size", "RowParallelLinear"
        )
        self.explicit_expert_comm = is_expert and (tp_size > 1 or self.expert_parallel)
        self.master_weight = None
        device, dtype = _param_device(config), config.params_dtype

        self.weight = Parameter(
            torch.empty(output_size, self.input_size_per_partition, device=device, dtype=dtype)
        )
        set_tensor_model_parallel_attributes(self.weight, True, 1, stride)
        _mark_wgrad_fusion(self.weight, config)
        if config.perform_initialization:
            if config.use_cpu_initialization:
                self.master_weight = _initialize_affine_weight_cpu(
                    self.weight,
                    output_size,
                    input_size,
                    self.input_size_per_partition,
                    1,
                    init_method,
                    stride=stride,
                    return_master_weight=keep_master_weight_for_test,
                    params_dtype=dtype,
                    rank=tp_rank,
                    world_size=tp_size,
                )
            else:
                _initialize_affine_weight_gpu(self.weight, init_method, 1, stride, is_expert)
        self.weight.allreduce = not (is_expert and self.expert_parallel)

        if bias:
            self.bias = Parameter(torch.empty(output_size, device=device, dtype=dtype))
            if config.perform_initialization:
                with torch.no_grad():
                    self.bias.zero_()
            self.bias.allreduce = not (is_expert and self.expert_parallel)
            # Under SP each rank's bias grad covers only its tokens: DDP all-reduces it over TP.
            self.bias.sequence_parallel = self.sequence_parallel
        else:
            self.register_parameter("bias", None)
        # gigatron.core.fp8_utils.Fp8Recipe: run the GEMMs in FP8 (set by the transformer block)
        self.fp8_recipe = None
        self.fp8_state = None  # tensor_parallel.fp8_delayed.Fp8DelayedState (delayed scaling)

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[s, b, h/tp]` (or `[s, b, h]`) -> `([s, b, o] or [s/tp, b, o] under SP, bias/None)`."""
        if self.input_is_parallel:
            input_parallel = input_
        else:
            input_parallel = scatter_to_tensor_model_parallel_region(input_, self.tp_group)
        # Nothing to reduce (one TP rank, no expert communication): a bias that is not skipped
        # goes into the GEMM like ColumnParallelLinear's (cuBLAS bias epilogue when compiled).
        gemm_bias = None
        if not self.skip_bias_add and not self.explicit_expert_comm:
            gemm_bias = self.bias if group_size(self.tp_group) == 1 else None
        if self.fp8_recipe is not None:
            output_ = self._reduce_output(
                Fp8LinearFunction.apply(
                    input_parallel, self.weight, gemm_bias, self.fp8_recipe, "row",
                    self.gradient_accumulation_fusion, False, False, self.tp_group,
                    delayed_args(self.fp8_state),
                )  # [s, b, o] partial sums
            )  # fmt: skip
        elif self._overlaps_reduce_scatter():  # matmul and reduce-scatter pipelined
            output_ = LinearReduceScatterOverlapped.apply(
                input_parallel, self.weight, self.gradient_accumulation_fusion, self.tp_group
            )  # [s/tp, b, o]
        else:
            output_ = self._reduce_output(
                linear_with_grad_accumulation_and_async_allreduce(
                    input=input_parallel,
                    weight=self.weight,
                    bias=gemm_bias,
                    gradient_accumulation_fusion=self.gradient_accumulation_fusion,
                    allreduce_dgrad=False,
                    sequence_parallel=False,
                    tp_group=self.tp_group,
                )  # [s, b, o] partial sums
            )
        if self.skip_bias_add:
            return output_, self.bias
        if self.bias is None or gemm_bias is not None:
            return output_, None
        return output_ + self.bias, None  # after the reduction

    def _overlaps_reduce_scatter(self) -> bool:
        """`tp_comm_overlap` under SP: the output reduce-scatter is pipelined with the matmul."""
        return (
            self.sequence_parallel
            and not self.explicit_expert_comm
            and bool(getattr(self.config, "tp_comm_overlap", False))
            and group_size(self.tp_group) > 1
        )

    def _reduce_output(self, output_parallel: torch.Tensor) -> torch.Tensor:
        """`[s, b, o]` partial sums -> reduce-scatter (SP, `[s/tp, b, o]`) or all-reduce."""
        if self.explicit_expert_comm:
            if not self.skip_bias_add:
                raise ValueError(
                    "RowParallelLinear: expert layers with expert communication need "
                    "skip_bias_add=True (the token dispatcher reduces the output)"
                )
            return output_parallel
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(output_parallel, self.tp_group)
        return reduce_from_tensor_model_parallel_region(output_parallel, self.tp_group)

    def __repr__(self) -> str:
        tp = group_size(self.tp_group)
        return (
            f"{type(self).__name__}(in_features={self.input_size}, "
            f"out_features={self.output_size}, bias={self.bias is not None}, TP={tp})"
        )


class VocabParallelEmbedding(torch.nn.Module):
    """Embedding table split along the vocabulary: rank r holds rows `[r*V/tp, (r+1)*V/tp)`.

    Input ids `[b, s]` -> `[b, s, h]` (all-reduced), or `[s/tp, b, h]` with
    `reduce_scatter_embeddings` (transposed to sequence-first, then reduce-scattered).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        init_method: Callable,
        reduce_scatter_embeddings: bool = False,
        config: ModelParallelConfig,
        tp_group=None,
        pg_collection=None,
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.reduce_scatter_embeddings = reduce_scatter_embeddings
        self.deterministic_mode = config.deterministic_mode
        self.tp_group = _resolve_group(tp_group, pg_collection, is_expert=False)
        tp_size, tp_rank = group_size(self.tp_group), group_rank(self.tp_group)
        self.tp_size = tp_size
        self.num_embeddings_per_partition = _per_rank(
            num_embeddings, tp_size, "num_embeddings", "VocabParallelEmbedding"
        )
        self.vocab_start_index, self.vocab_end_index = (
            VocabUtility.vocab_range_from_global_vocab_size(num_embeddings, tp_rank, tp_size)
        )
        device, dtype = _param_device(config), config.params_dtype
        self.weight = Parameter(
            torch.empty(
                self.num_embeddings_per_partition, embedding_dim, device=device, dtype=dtype
            )
        )
        set_tensor_model_parallel_attributes(self.weight, True, 0, 1)
        if config.perform_initialization:
            if config.use_cpu_initialization:
                _initialize_affine_weight_cpu(
                    self.weight,
                    num_embeddings,
                    embedding_dim,
                    self.num_embeddings_per_partition,
                    0,
                    init_method,
                    params_dtype=dtype,
                    rank=tp_rank,
                    world_size=tp_size,
                )
            else:
                _initialize_affine_weight_gpu(self.weight, init_method, 0, 1)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """The vocab-split weight; `allow_shape_mismatch`: a checkpoint of another padded
        vocabulary size loads (rows trimmed or zero-filled)."""
        key = f"{prefix}weight"
        sharded = make_tp_sharded_tensor_for_checkpoint(
            self.weight, key, allow_shape_mismatch=True, prepend_offsets=sharded_offsets,
            tp_group=self.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )  # fmt: skip
        return {key: sharded}

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        """ids `[b, s]` -> `[b, s, h]` (or `[s/tp, b, h]` with reduce_scatter_embeddings)."""
        if self.tp_size > 1:
            # Ids owned by other ranks look up row 0 and are zeroed; the TP sum fills them in.
            input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
            masked_input = (input_ - self.vocab_start_index).masked_fill(input_mask, 0)
        else:
            masked_input = input_
        if self.deterministic_mode:
            output_parallel = self.weight[masked_input]
        else:
            output_parallel = F.embedding(masked_input, self.weight)  # [b, s, h]
        if self.tp_size > 1:
            output_parallel = output_parallel.masked_fill(input_mask.unsqueeze(-1), 0.0)
        if self.reduce_scatter_embeddings:
            output_parallel = output_parallel.transpose(0, 1).contiguous()  # [s, b, h]
            return reduce_scatter_to_sequence_parallel_region(output_parallel, self.tp_group)
        return reduce_from_tensor_model_parallel_region(output_parallel, self.tp_group)
