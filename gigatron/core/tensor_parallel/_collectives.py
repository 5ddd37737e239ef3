"""The raw collectives behind the autograd mappings (no autograd here).

Each helper takes an explicit process group and returns a new tensor; none of them modifies its
input. At group size 1 they return the input unchanged and issue no communication. Layout rules
follow `megatron.core.tensor_parallel.mappings`: "first dim" is the sequence dim of `[s, b, h]`,
"last dim" is the hidden dim; last-dim gathers are dim-0 collectives followed by a concatenation.

Under `torch.compile` (`torch.compiler.is_compiling()`) the same helpers issue the traceable
functional collectives (`torch.ops._c10d_functional`: one op that starts the collective and
returns its result tensor, plus `wait_tensor`), so dynamo keeps them in the graph
(`fullgraph=True` works) and Inductor may move them. Eager keeps the `torch.distributed` calls
(and their counts) unchanged; both paths give the same numbers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.utils import all_gather_into, group_rank, group_size, reduce_scatter_into

_C10D = torch.ops._c10d_functional


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    """`x.contiguous()` without the no-op call on a contiguous tensor: torch 2.11's tracing of an
    autograd.Function whose forward or backward ends in that no-op loses the input grad (zeros;
    tests/core/tensor_parallel/test_compile.py under torch 2.11). torch >= 2.12 traces either
    form."""
    return x if x.is_contiguous() else x.contiguous()


# --- traced (functional) collectives: used while torch.compile traces -----------------------
# The ops take the group's name (a string in every torch from 2.11 on); `group.group_name` is
# what torch's own functional-collective wrappers read, so dynamo traces it.


def _group_name(group) -> str:
    return (group if group is not None else dist.group.WORLD).group_name


# Groups whose dim-0 all-gathers and reduce-scatters run on the copy engines
# (`_ce_collectives.py`, CUDA only; `enable_copy_engine_collectives`).
_COPY_ENGINE_GROUPS: set[str] = set()


def enable_copy_engine_collectives(group, enabled: bool = True) -> None:
    """Route `group`'s dim-0 all-gathers and reduce-scatters (traced and eager) through the
    copy-engine collectives of `_ce_collectives.py` (CUDA tensors only), or back to NCCL."""
    from gigatron.core.tensor_parallel import _ce_collectives  # noqa: F401  (registers the ops)

    parallel_state._on_destroy(reset_copy_engine_collectives)
    name = _group_name(group)
    if enabled:
        _COPY_ENGINE_GROUPS.add(name)
    else:
        _COPY_ENGINE_GROUPS.discard(name)


def reset_copy_engine_collectives() -> None:
    """Route every group back to NCCL and free the copy-engine workspaces (run by
    `parallel_state.destroy_model_parallel` once routing was enabled)."""
    _COPY_ENGINE_GROUPS.clear()
    import sys

    module = sys.modules.get("gigatron.core.tensor_parallel._ce_collectives")
    if module is not None:
        module._WORKSPACES.clear()


def _copy_engine(inp: torch.Tensor, group) -> bool:
    return bool(_COPY_ENGINE_GROUPS) and inp.is_cuda and _group_name(group) in _COPY_ENGINE_GROUPS


def _start_all_gather(inp: torch.Tensor, group) -> torch.Tensor:
    """Issue an all-gather along dim 0 (traced, or a copy-engine op); `_wait` the result."""
    if _copy_engine(inp, group):
        return torch.ops.gigatron.ce_all_gather(inp, _group_name(group))
    return _C10D.all_gather_into_tensor(inp, group_size(group), _group_name(group))


def _start_reduce_scatter(inp: torch.Tensor, group) -> torch.Tensor:
    """Issue a sum reduce-scatter along dim 0 (traced, or copy-engine); `_wait` the result."""
    if _copy_engine(inp, group):
        return torch.ops.gigatron.ce_reduce_scatter(inp, _group_name(group))
    return _C10D.reduce_scatter_tensor(inp, "sum", group_size(group), _group_name(group))


def _start_all_reduce(inp: torch.Tensor, group) -> torch.Tensor:
    """Issue a traced sum all-reduce (out of place); `_wait` the result before using it."""
    return _C10D.all_reduce(inp, "sum", _group_name(group))


def _wait(t: torch.Tensor) -> torch.Tensor:
    """Wait for a traced collective's result (stream sync on CUDA, blocking on CPU)."""
    return _C10D.wait_tensor(t)


def _start_async(kind: str, x: torch.Tensor, group) -> tuple[torch.Tensor, object]:
    """Start a dim-0 collective without waiting: `kind` is "all_gather" (`[n, ...] ->
    [tp*n, ...]`), "reduce_scatter" (`[tp*n, ...] -> [n, ...]`, sum) or "all_reduce" (sum, in
    place on `x` in eager: pass a tensor you own). Returns `(result, handle)` for `_finish`;
    eager gives a buffer and an async work handle, torch.compile a graph tensor and None.
    """
    x = _contiguous(x)
    if torch.compiler.is_compiling() or (kind != "all_reduce" and _copy_engine(x, group)):
        start = {
            "all_gather": _start_all_gather,
            "reduce_scatter": _start_reduce_scatter,
            "all_reduce": _start_all_reduce,
        }[kind]
        return start(x, group), None
    if kind == "all_reduce":
        return x, dist.all_reduce(x, group=group, async_op=True)
    if kind == "all_gather":
        out = x.new_empty((x.size(0) * group_size(group), *x.shape[1:]))
        return out, all_gather_into(out, x, group, async_op=True)
    out = x.new_empty((x.size(0) // group_size(group), *x.shape[1:]))
    return out, reduce_scatter_into(out, x, group, async_op=True)


def _start_exchange(x: torch.Tensor, dst: int, src: int, group) -> tuple[torch.Tensor, object]:
    """Send `x` to group rank `dst` and receive a tensor of the same shape from group rank `src`,
    without waiting (an all-to-all whose only non-empty chunks are those two; every rank of the
    group calls it with a consistent pairing). `_finish` the returned `(result, handle)`."""
    x = _contiguous(x)
    world_size = group_size(group)
    send = [x.size(0) if i == dst else 0 for i in range(world_size)]
    recv = [x.size(0) if i == src else 0 for i in range(world_size)]
    if torch.compiler.is_compiling():
        return _C10D.all_to_all_single(x, recv, send, _group_name(group)), None
    out = torch.empty_like(x)
    handle = dist.all_to_all_single(
        out, x, output_split_sizes=recv, input_split_sizes=send, group=group, async_op=True
    )
    return out, handle


def _finish(result: torch.Tensor, handle) -> torch.Tensor:
    """Wait for a collective from `_start_async`; returns its result."""
    if handle is None:
        return _wait(result)
    handle.wait()
    return result


def _gathered_dim0(inp: torch.Tensor, group) -> torch.Tensor:
    """`[n, ...] -> [tp*n, ...]`: all-gather along dim 0 (`inp` contiguous)."""
    if torch.compiler.is_compiling() or _copy_engine(inp, group):
        return _wait(_start_all_gather(inp, group))
    out = inp.new_empty((inp.size(0) * group_size(group), *inp.shape[1:]))
    all_gather_into(out, inp, group)
    return out


def _reduce_scattered_dim0(inp: torch.Tensor, group) -> torch.Tensor:
    """`[tp*n, ...] -> [n, ...]`: sum over ranks; keep this rank's dim-0 chunk."""
    if torch.compiler.is_compiling() or _copy_engine(inp, group):
        return _wait(_start_reduce_scatter(inp, group))
    out = inp.new_empty((inp.size(0) // group_size(group), *inp.shape[1:]))
    reduce_scatter_into(out, inp, group)
    return out


def _check_divisible(what: str, size: int, world_size: int, fn: str) -> None:
    if size % world_size != 0:
        raise ValueError(
            f"{fn}: {what} ({size}) must be divisible by the tensor-parallel group size "
            f"({world_size})"
        )


def _reduce(x: torch.Tensor, group) -> torch.Tensor:
    """All-reduce (sum) a copy of `x`; the caller's tensor is left untouched."""
    if group_size(group) == 1:
        return x
    if torch.compiler.is_compiling():
        return _wait(_start_all_reduce(_contiguous(x), group))
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def _split_along_last_dim(x: torch.Tensor, group) -> torch.Tensor:
    """`[..., h] -> [..., h/tp]`: keep this rank's slice of the last dim (no communication)."""
    world_size = group_size(group)
    if world_size == 1:
        return x
    _check_divisible("last dim", x.size(-1), world_size, "split along last dim")
    per_rank = x.size(-1) // world_size
    rank = group_rank(group)
    return _contiguous(x[..., rank * per_rank : (rank + 1) * per_rank])


def _split_along_first_dim(x: torch.Tensor, group) -> torch.Tensor:
    """`[s, ...] -> [s/tp, ...]`: keep this rank's slice of dim 0 (no communication)."""
    world_size = group_size(group)
    if world_size == 1:
        return x
    _check_divisible("dim 0", x.size(0), world_size, "split along first dim")
    per_rank = x.size(0) // world_size
    rank = group_rank(group)
    return _contiguous(x[rank * per_rank : (rank + 1) * per_rank])


def _gather_along_first_dim(x: torch.Tensor, group, output_split_sizes=None) -> torch.Tensor:
    """`[s/tp, ...] -> [s, ...]`: all-gather along dim 0, rank order.

    With `output_split_sizes` (rank i contributes `output_split_sizes[i]` rows) the chunks may
    differ in size; they are padded to the largest for the single all-gather, then trimmed.
    """
    world_size = group_size(group)
    if world_size == 1:
        return x
    x = _contiguous(x)
    if output_split_sizes is None:
        return _gathered_dim0(x, group)
    sizes = list(output_split_sizes)
    if len(sizes) != world_size or sizes[group_rank(group)] != x.size(0):
        raise ValueError(
            f"output_split_sizes ({sizes}) must have one entry per rank ({world_size}) and "
            f"this rank's entry must equal dim 0 of the input ({x.size(0)})"
        )
    longest = max(sizes)
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[: x.size(0)] = x
    out = _gathered_dim0(padded, group)
    return torch.cat([out[i * longest : i * longest + n] for i, n in enumerate(sizes)], dim=0)


def _gather_along_last_dim(x: torch.Tensor, group) -> torch.Tensor:
    """`[..., h/tp] -> [..., h]`: dim-0 all-gather, then the chunks concatenated on the last dim."""
    world_size = group_size(group)
    if world_size == 1:
        return x
    gathered = _gather_along_first_dim(x, group)
    return torch.cat(gathered.chunk(world_size, dim=0), dim=-1)  # a new contiguous tensor


def _reduce_scatter_along_first_dim(x: torch.Tensor, group, input_split_sizes=None):
    """`[s, ...] -> [s/tp, ...]`: sum over ranks, keep this rank's dim-0 chunk.

    With `input_split_sizes` rank i keeps `input_split_sizes[i]` rows (uneven chunks).
    """
    world_size = group_size(group)
    if world_size == 1:
        return x
    x = _contiguous(x)
    if input_split_sizes is None:
        _check_divisible("dim 0", x.size(0), world_size, "reduce-scatter along first dim")
        return _reduce_scattered_dim0(x, group)
    sizes = list(input_split_sizes)
    if len(sizes) != world_size or sum(sizes) != x.size(0):
        raise ValueError(
            f"input_split_sizes ({sizes}) must have one entry per rank ({world_size}) and sum "
            f"to dim 0 of the input ({x.size(0)})"
        )
    # Uneven chunks: pad every chunk to the longest, reduce-scatter once, trim ours.
    longest = max(sizes)
    padded = x.new_zeros((longest * world_size, *x.shape[1:]))
    for i, chunk in enumerate(x.split(sizes, dim=0)):
        padded[i * longest : i * longest + chunk.size(0)] = chunk
    out = _reduce_scattered_dim0(padded, group)
    return _contiguous(out[: sizes[group_rank(group)]])


def _reduce_scatter_along_last_dim(x: torch.Tensor, group) -> torch.Tensor:
    """`[..., h] -> [..., h/tp]`: sum over ranks, keep this rank's last-dim slice."""
    world_size = group_size(group)
    if world_size == 1:
        return x
    _check_divisible("last dim", x.size(-1), world_size, "reduce-scatter along last dim")
    out_shape = (*x.shape[:-1], x.size(-1) // world_size)
    rows = x.reshape(-1, x.size(-1))
    # Stack the last-dim chunks along dim 0 so chunk i lands on rank i.
    stacked = torch.cat(torch.split(rows, x.size(-1) // world_size, dim=1), dim=0)
    return _reduce_scatter_along_first_dim(stacked, group).reshape(out_shape)


def _start_all_to_all(x: torch.Tensor, group, output_split_sizes=None, input_split_sizes=None):
    """Issue `_all_to_all` (group size > 1) without waiting; `_finish` the `(result, handle)`.

    Eager gives the output buffer and an async work handle, torch.compile a graph tensor and
    None (the traced collective, waited by `_wait`)."""
    world_size = group_size(group)
    x = _contiguous(x)
    even = None  # a side without split sizes is split evenly (as `_all_to_all`)
    if output_split_sizes is None or input_split_sizes is None:
        _check_divisible("dim 0", x.size(0), world_size, "all_to_all")
        even = [x.size(0) // world_size] * world_size
    out_sizes = even if output_split_sizes is None else list(output_split_sizes)
    in_sizes = even if input_split_sizes is None else list(input_split_sizes)
    if torch.compiler.is_compiling():
        return _C10D.all_to_all_single(x, out_sizes, in_sizes, _group_name(group)), None
    out = x.new_empty((sum(out_sizes), *x.shape[1:]))
    handle = dist.all_to_all_single(
        out,
        x,
        output_split_sizes=out_sizes,
        input_split_sizes=in_sizes,
        group=group,
        async_op=True,
    )
    return out, handle


def _all_to_all(x: torch.Tensor, group, output_split_sizes=None, input_split_sizes=None):
    """All-to-all along dim 0: chunk i of `x` goes to rank i; received chunks stack in rank order.

    Without split sizes the chunks are equal (`x.size(0)` must divide); with them, `x` is split
    by `input_split_sizes` and `output_split_sizes[i]` rows arrive from rank i.
    """
    world_size = group_size(group)
    if world_size == 1:
        return x
    x = _contiguous(x)
    if output_split_sizes is None:
        _check_divisible("dim 0", x.size(0), world_size, "all_to_all")
    if torch.compiler.is_compiling():
        even = [x.size(0) // world_size] * world_size
        return _wait(
            _C10D.all_to_all_single(
                x, output_split_sizes or even, input_split_sizes or even, _group_name(group)
            )
        )
    if output_split_sizes is None:
        out = torch.empty_like(x)
    else:
        out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
    dist.all_to_all_single(
        out,
        x,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    return out
