"""Autograd-aware collectives that move activations in and out of the tensor-parallel region.

Mirrors `megatron.core.tensor_parallel.mappings`: one autograd Function per collective (Megatron's
class names), the public functions keep Megatron's names and argument order, and `group=None`
means parallel_state's tensor-parallel group. Every mapping is the identity (no communication)
when the group has one rank. Unlike Megatron, no mapping writes into its input or into the
incoming gradient: all-reduces work on a copy.

Most mappings are one collective forward and its adjoint backward; they are declared as
`_CollectivePair` subclasses that name the two ops, and their public functions are made by
`_public_mapping`. The three with extra arguments (uneven split sizes, the choice of backward)
are written out in full.

Layouts: `[s, b, h]` activations; "sequence parallel" splits dim 0 (s), "tensor parallel" splits
the last dim (h). `tp` below is the group size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gigatron.core.tensor_parallel._collectives import (
    _all_to_all,
    _contiguous,
    _gather_along_first_dim,
    _gather_along_last_dim,
    _reduce,
    _reduce_scatter_along_first_dim,
    _reduce_scatter_along_last_dim,
    _split_along_first_dim,
    _split_along_last_dim,
)
from gigatron.core.tensor_parallel.async_mappings import all_to_all_async
from gigatron.core.utils import (
    get_tensor_model_parallel_group_if_none,
    group_size,
)

__all__ = [
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
    "all_to_all_async",
    "all_to_all_sp2hp",
    "all_to_all_hp2sp",
]


def _identity(x: torch.Tensor, group) -> torch.Tensor:
    return x


class _CollectivePair(torch.autograd.Function):
    """A mapping that is one collective forward and its adjoint backward, both `(tensor, group)`.

    A subclass sets `forward_op` and `backward_op` (plain functions, read once when the class is
    made) and `public_name`, the Megatron function that `_public_mapping` builds for it; it gets
    `apply(x, group)` with `forward(ctx, x, group)` and `backward(ctx, grad) -> (grad_in, None)`.
    """

    forward_op: Callable[[torch.Tensor, object], torch.Tensor]
    backward_op: Callable[[torch.Tensor, object], torch.Tensor]
    public_name: str

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        forward_op, backward_op = cls.forward_op, cls.backward_op

        # Closures over the two ops rather than methods reading them from the class: `ctx` is
        # not an instance of the class, and dynamo traces plain functions (fullgraph works).
        def forward(ctx, x, group):
            ctx.group = group
            return forward_op(x, group)

        def backward(ctx, grad):
            return backward_op(grad, ctx.group), None

        for fn in (forward, backward):
            if fn.__name__ in cls.__dict__:  # a subclass that writes its own keeps it
                continue
            fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"  # readable tracebacks
            setattr(cls, fn.__name__, staticmethod(fn))


class _CopyToModelParallelRegion(_CollectivePair):
    """Enter the TP region: every rank uses the full input, so input grads are summed.

    forward:  [..., h] -> identity        -> [..., h]
    backward: [..., h] grad -> all-reduce -> [..., h]
    """

    forward_op, backward_op = _identity, _reduce
    public_name = "copy_to_tensor_model_parallel_region"


class _ReduceFromModelParallelRegion(_CollectivePair):
    """Leave the TP region by summing partial results.

    forward:  [..., h] partial -> all-reduce -> [..., h]
    backward: [..., h] grad    -> identity   -> [..., h]
    """

    forward_op, backward_op = _reduce, _identity
    public_name = "reduce_from_tensor_model_parallel_region"


class _ScatterToModelParallelRegion(_CollectivePair):
    """Keep this rank's slice of the last dim.

    forward:  [..., h] -> split last dim             -> [..., h/tp]
    backward: [..., h/tp] grad -> all-gather last dim -> [..., h]
    """

    forward_op, backward_op = _split_along_last_dim, _gather_along_last_dim
    public_name = "scatter_to_tensor_model_parallel_region"


class _GatherFromModelParallelRegion(_CollectivePair):
    """Concatenate the last-dim slices of all ranks; the backward keeps this rank's slice.

    forward:  [..., h/tp] -> all-gather last dim -> [..., h]
    backward: [..., h] grad -> split last dim     -> [..., h/tp]
    """

    forward_op, backward_op = _gather_along_last_dim, _split_along_last_dim
    public_name = "gather_from_tensor_model_parallel_region"


class _ScatterToSequenceParallelRegion(_CollectivePair):
    """Keep this rank's slice of the sequence.

    forward:  [s, b, h] -> split dim 0                -> [s/tp, b, h]
    backward: [s/tp, b, h] grad -> all-gather dim 0   -> [s, b, h]
    """

    forward_op, backward_op = _split_along_first_dim, _gather_along_first_dim
    public_name = "scatter_to_sequence_parallel_region"


class _AllGatherFromTensorParallelRegion(_CollectivePair):
    """Concatenate last-dim slices; the consumer is tensor-parallel, so grads are summed.

    forward:  [..., h/tp] -> all-gather last dim          -> [..., h]
    backward: [..., h] grad -> reduce-scatter last dim    -> [..., h/tp]
    """

    forward_op, backward_op = _gather_along_last_dim, _reduce_scatter_along_last_dim
    public_name = "all_gather_last_dim_from_tensor_parallel_region"


class _ReduceScatterToTensorParallelRegion(_CollectivePair):
    """Sum partial results over ranks, keep this rank's last-dim slice.

    forward:  [..., h] partial -> reduce-scatter last dim -> [..., h/tp]
    backward: [..., h/tp] grad -> all-gather last dim     -> [..., h]
    """

    forward_op, backward_op = _reduce_scatter_along_last_dim, _gather_along_last_dim
    public_name = "reduce_scatter_last_dim_to_tensor_parallel_region"


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Rebuild the full sequence from the per-rank slices.

    forward:  [s/tp, b, h] -> all-gather dim 0 -> [s, b, h]
    backward: [s, b, h] grad -> reduce-scatter dim 0 -> [s/tp, b, h]
              (plain split instead when `tensor_parallel_output_grad=False`: the consumer of
              the output was not tensor-parallel, so every rank already holds the full grad)
    """

    @staticmethod
    def forward(ctx, x, tensor_parallel_output_grad, group, output_split_sizes):
        ctx.tensor_parallel_output_grad = tensor_parallel_output_grad
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        return _gather_along_first_dim(x, group, output_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        if ctx.tensor_parallel_output_grad:
            grad_in = _reduce_scatter_along_first_dim(grad, ctx.group, ctx.output_split_sizes)
        elif ctx.output_split_sizes is None:
            grad_in = _split_along_first_dim(grad, ctx.group)
        else:
            rank = torch.distributed.get_rank(group=ctx.group)
            grad_in = _contiguous(grad.split(list(ctx.output_split_sizes), dim=0)[rank])
        return grad_in, None, None, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Sum partial outputs over TP ranks, keep this rank's sequence slice.

    forward:  [s, b, h] partial -> reduce-scatter dim 0 -> [s/tp, b, h]
    backward: [s/tp, b, h] grad -> all-gather dim 0     -> [s, b, h]
    """

    @staticmethod
    def forward(ctx, x, group, input_split_sizes):
        ctx.group = group
        ctx.input_split_sizes = input_split_sizes
        return _reduce_scatter_along_first_dim(x, group, input_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        return _gather_along_first_dim(grad, ctx.group, ctx.input_split_sizes), None, None


class _AllToAll(torch.autograd.Function):
    """Exchange dim-0 chunks between ranks (chunk i goes to rank i).

    forward:  [n_in, ...]  -> all-to-all(v)         -> [n_out, ...]
    backward: [n_out, ...] grad -> reverse all-to-all -> [n_in, ...]
    """

    @staticmethod
    def forward(ctx, group, x, output_split_sizes, input_split_sizes):
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        return _all_to_all(x, group, output_split_sizes, input_split_sizes)

    @staticmethod
    def backward(ctx, grad):
        grad_in = _all_to_all(grad, ctx.group, ctx.input_split_sizes, ctx.output_split_sizes)
        return None, grad_in, None, None


# ---------------------------------------------------------------------------------------------
# Public functions (Megatron's names and argument order).


def _public_mapping(function_cls: type[_CollectivePair]):
    """Megatron's public function for a `_CollectivePair`: `input_, group=None` -> `apply`.

    It is named `function_cls.public_name` and documented by the Function's docstring.
    """

    def mapping(input_, group=None):
        group = get_tensor_model_parallel_group_if_none(group)
        return function_cls.apply(input_, group)

    mapping.__name__ = mapping.__qualname__ = function_cls.public_name
    mapping.__doc__ = f"{function_cls.__doc__.rstrip()}\n\n    `group=None`: the TP group."
    return mapping


copy_to_tensor_model_parallel_region = _public_mapping(_CopyToModelParallelRegion)
reduce_from_tensor_model_parallel_region = _public_mapping(_ReduceFromModelParallelRegion)
scatter_to_tensor_model_parallel_region = _public_mapping(_ScatterToModelParallelRegion)
gather_from_tensor_model_parallel_region = _public_mapping(_GatherFromModelParallelRegion)
scatter_to_sequence_parallel_region = _public_mapping(_ScatterToSequenceParallelRegion)
all_gather_last_dim_from_tensor_parallel_region = _public_mapping(
    _AllGatherFromTensorParallelRegion
)
reduce_scatter_last_dim_to_tensor_parallel_region = _public_mapping(
    _ReduceScatterToTensorParallelRegion
)


def gather_from_sequence_parallel_region(
    input_,
    tensor_parallel_output_grad=True,
    group=None,
    output_split_sizes=None,
    use_global_buffer=False,
):
    """`[s/tp, b, h] -> [s, b, h]` (all-gather); backward reduce-scatters dim 0.

    `tensor_parallel_output_grad=False` makes the backward a plain split (the output feeds a
    non-tensor-parallel op). `output_split_sizes` allows uneven per-rank chunks.
    `use_global_buffer` is accepted for compatibility (gigatron always allocates).
    """
    group = get_tensor_model_parallel_group_if_none(group)
    return _GatherFromSequenceParallelRegion.apply(
        input_, tensor_parallel_output_grad, group, output_split_sizes
    )


def reduce_scatter_to_sequence_parallel_region(
    input_, group=None, input_split_sizes=None, use_global_buffer=False
):
    """`[s, b, h] -> [s/tp, b, h]` (reduce-scatter); backward all-gathers dim 0."""
    group = get_tensor_model_parallel_group_if_none(group)
    return _ReduceScatterToSequenceParallelRegion.apply(input_, group, input_split_sizes)


def all_to_all(
    group, input_, output_split_sizes_=None, input_split_sizes=None, use_nccl_stream=False
):
    """All-to-all along dim 0 over `group` (required, first as in Megatron); backward reverses it.

    `use_nccl_stream` is accepted for compatibility and has no effect.
    """
    group = get_tensor_model_parallel_group_if_none(group)
    return _AllToAll.apply(group, input_, output_split_sizes_, input_split_sizes)


def _token_rows(input_, group):
    """`[..., H] -> [T, H]` rows (T tokens), with the resolved group and its size."""
    group = get_tensor_model_parallel_group_if_none(group)
    return input_.reshape(-1, input_.shape[-1]), group, group_size(group)


def all_to_all_sp2hp(input_, group=None):
    """Sequence-split to hidden-split: `[T/tp, H] -> [T, H/tp]` (T tokens, H hidden).

    Rank j receives hidden slice j of every rank's tokens, stacked in rank order.
    """
    rows, group, world_size = _token_rows(input_, group)  # [T/tp, H]
    if world_size == 1:
        return rows
    if rows.size(-1) % world_size != 0:
        raise ValueError(
            f"all_to_all_sp2hp: hidden size ({rows.size(-1)}) must be divisible by the "
            f"group size ({world_size})"
        )
    stacked = torch.cat(torch.split(rows, rows.size(-1) // world_size, dim=1), dim=0)
    return all_to_all(group, stacked)  # [T, H/tp]


def all_to_all_hp2sp(input_, group=None):
    """Hidden-split to sequence-split: `[T, H/tp] -> [T/tp, H]` (inverse of `all_to_all_sp2hp`)."""
    rows, group, world_size = _token_rows(input_, group)  # [T, H/tp]
    if world_size == 1:
        return rows
    exchanged = all_to_all(group, rows)  # [tp * T/tp, H/tp], block i = rank i's hidden slice
    return torch.cat(torch.split(exchanged, exchanged.size(0) // world_size, dim=0), dim=-1)
