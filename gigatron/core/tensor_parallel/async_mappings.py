"""`all_to_all_async`: an all-to-all that overlaps the work issued before its `wait()`.

A gigatron addition beside `mappings.all_to_all` (Megatron overlaps its MoE all-to-alls on a
side CUDA stream instead); `mappings` re-exports it. Two autograd Functions share one exchange:
`_AllToAllStart` issues it (eager: `torch.distributed.all_to_all_single(..., async_op=True)`;
under torch.compile the traced functional collective) and returns the output buffer, complete
only after `_AllToAllWait` (the `wait()` returned to the caller) has waited for it.

Backward, eager: `_AllToAllWait`'s backward issues the reverse exchange of the incoming grad
without waiting, and `_AllToAllStart`'s backward waits for it. The autograd engine runs ready
nodes latest-created first, so the backward of the work issued between start and wait runs while
the reverse exchange is in flight. Under torch.compile the backward is the blocking reverse
exchange (Inductor schedules the traced collectives itself).

Shapes: [n_in, ...] -> [n_out, ...]: dim 0 split by the split sizes, as `all_to_all`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gigatron.core.tensor_parallel._collectives import (
    _all_to_all,
    _finish,
    _start_all_to_all,
    _wait,
)
from gigatron.core.utils import get_tensor_model_parallel_group_if_none, group_size

__all__ = ["all_to_all_async"]


class _AllToAllStart(torch.autograd.Function):
    """Issue the exchange; the output is complete once `_AllToAllWait` ran.

    forward:  [n_in, ...] -> [n_out, ...] (eager: its work handle goes into `state`)
    backward: [n_out, ...] grad -> [n_in, ...]: waits for the reverse exchange that
              `_AllToAllWait`'s backward issued (eager), or runs it (traced)
    """

    @staticmethod
    def forward(ctx, group, x, output_split_sizes, input_split_sizes, state):
        ctx.group = group
        ctx.output_split_sizes = output_split_sizes
        ctx.input_split_sizes = input_split_sizes
        out, handle = _start_all_to_all(x, group, output_split_sizes, input_split_sizes)
        ctx.state = None if handle is None else state  # None: traced, `_AllToAllWait` waits
        if handle is not None:
            state.update(forward=handle, group=group)
            state["reverse_splits"] = (input_split_sizes, output_split_sizes)
        return out

    @staticmethod
    def backward(ctx, grad):
        pending = None if ctx.state is None else ctx.state.pop("backward", None)
        if pending is None:
            grad_in = _all_to_all(grad, ctx.group, ctx.input_split_sizes, ctx.output_split_sizes)
        else:
            grad_in = _finish(*pending)
        return None, grad_in, None, None, None


class _AllToAllWait(torch.autograd.Function):
    """Wait for `_AllToAllStart`'s exchange; returns its output [n_out, ...].

    backward (eager): issue the reverse exchange of the grad without waiting (its result goes
    into `state` for `_AllToAllStart`'s backward) and pass the grad on; traced: the identity.
    """

    @staticmethod
    def forward(ctx, out, state):
        if "forward" not in state:  # traced collective
            ctx.state = None
            return _wait(out)
        ctx.state = state
        state.pop("forward").wait()
        return out

    @staticmethod
    def backward(ctx, grad):
        state = ctx.state
        if state is not None:
            state["backward"] = _start_all_to_all(grad, state["group"], *state["reverse_splits"])
        return grad, None


def all_to_all_async(
    group, input_, output_split_sizes_=None, input_split_sizes=None
) -> Callable[[], torch.Tensor]:
    """Start `all_to_all(group, input_, ...)` and return `wait`: `wait()` -> its output.

    Work issued between this call and `wait()` overlaps the exchange, and in the eager backward
    that work's backward overlaps the reverse exchange. Call `wait()` once, before reading the
    output. Group size 1: `wait()` returns `input_` (no communication).
    """
    group = get_tensor_model_parallel_group_if_none(group)
    if group_size(group) == 1:
        return lambda: input_
    state: dict = {}
    out = _AllToAllStart.apply(group, input_, output_split_sizes_, input_split_sizes, state)
    return lambda: _AllToAllWait.apply(out, state)
