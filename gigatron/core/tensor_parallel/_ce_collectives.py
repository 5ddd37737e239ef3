"""Copy-engine all-gather and reduce-scatter along dim 0 for one NVLink node (CUDA only).

NCCL's kernels take SMs: overlapped with a GEMM they slow it down by as much time as they hide
(bench/reports/gpt-tensor-parallel.md). These collectives move data with the GPUs' copy engines
instead (`cudaMemcpyAsync` between peer-mapped buffers of `torch.distributed._symmetric_memory`),
on a side stream, signalled by the symmetric-memory barrier. gigatron's own; Megatron has no
counterpart (its TP overlap uses Transformer Engine's userbuffers).

Each collective is a custom op (`gigatron::ce_all_gather`, `gigatron::ce_reduce_scatter`) with a
fake implementation, so torch.compile keeps it in the graph as one opaque call; its result is
registered with c10d like a functional collective's, so `_c10d_functional.wait_tensor` waits for
it (traced and eager alike). The input is first copied into a symmetric workspace slot on the
caller's stream (that copy is the only SM work besides the reduce-scatter's sum), so the input may
be freed or reused as soon as the op returns. Slots rotate; a slot is rewritten only after the
collective that last used it has finished on the side stream.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

_SLOTS = 4


class _Workspace:
    """`_SLOTS` equal slots of one symmetric buffer per process group, grown on demand."""

    def __init__(self) -> None:
        self.handle = None
        self.buffer = None
        self.slot_bytes = 0
        self.next = 0
        self.done: list[torch.cuda.Event | None] = [None] * _SLOTS

    def reserve(self, nbytes: int, group_name: str):
        """A slot of at least `nbytes` for the next collective: returns (handle, byte offset)."""
        from torch.distributed import _symmetric_memory as symm_mem

        if nbytes > self.slot_bytes or self.handle is None:  # warm-up only (all ranks alike)
            torch.cuda.synchronize()
            # Slots start on 512-byte boundaries: any dtype's element offset is exact.
            self.slot_bytes = -(-max(nbytes, 2 * self.slot_bytes, 1) // 512) * 512
            device = torch.device("cuda", torch.cuda.current_device())
            self.buffer = symm_mem.empty(self.slot_bytes * _SLOTS, dtype=torch.uint8, device=device)
            self.handle = symm_mem.rendezvous(self.buffer, group_name)
            self.done = [None] * _SLOTS
        slot = self.next
        self.next = (slot + 1) % _SLOTS
        if self.done[slot] is not None:
            torch.cuda.current_stream().wait_event(self.done[slot])
        return slot, self.handle, slot * self.slot_bytes


def _group_size(group_name: str) -> int:
    return dist.get_world_size(_resolve_process_group(group_name))


_WORKSPACES: dict[str, _Workspace] = {}
_STREAM: list[torch.cuda.Stream] = []


def _side_stream() -> torch.cuda.Stream:
    if not _STREAM:
        _STREAM.append(torch.cuda.Stream())
    return _STREAM[0]


class _EventWork(dist.Work):
    """The c10d work of a copy-engine collective: waiting = the caller's stream waits for it."""

    def __init__(self, event: torch.cuda.Event) -> None:
        super().__init__()
        self.event = event

    def wait(self, timeout=None) -> bool:
        torch.cuda.current_stream().wait_event(self.event)
        return True


def _run(x: torch.Tensor, out: torch.Tensor, group_name: str, body) -> torch.Tensor:
    """Stage `x` in a workspace slot, run `body(handle, offset, rank, world)` (which fills `out`)
    on the side stream between two barriers, register `out` with c10d. Returns `out`."""
    ws = _WORKSPACES.setdefault(group_name, _Workspace())
    nbytes = x.numel() * x.element_size()
    slot, handle, offset = ws.reserve(nbytes, group_name)
    mine = handle.get_buffer(handle.rank, x.shape, x.dtype, offset // x.element_size())
    mine.copy_(x)  # caller's stream: x is free for reuse once this op returns
    side = _side_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        handle.barrier(channel=slot)  # every rank staged its input
        body(handle, offset // x.element_size(), handle.rank, handle.world_size)
        handle.barrier(channel=slot)  # every peer finished reading this rank's slot
        done = torch.cuda.Event()
        done.record()
    ws.done[slot] = done
    out.record_stream(side)  # allocated on the caller's stream, written on the side stream
    torch._C._distributed_c10d._register_work(out, _EventWork(done))
    return out


@torch.library.custom_op("gigatron::ce_all_gather", mutates_args=())
def ce_all_gather(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """`[n, ...] -> [world*n, ...]` in rank order; wait with `wait_tensor` before use."""
    x = x.contiguous()

    world = _group_size(group_name)
    out = x.new_empty((x.size(0) * world, *x.shape[1:]))

    def pull(handle, offset, rank, world):
        for step in range(world):
            peer = (rank + step) % world
            src = handle.get_buffer(peer, x.shape, x.dtype, offset)
            out[peer * x.size(0) : (peer + 1) * x.size(0)].copy_(src)

    return _run(x, out, group_name, pull)


@ce_all_gather.register_fake
def _(x, group_name):
    return x.new_empty((x.size(0) * _group_size(group_name), *x.shape[1:]))


@torch.library.custom_op("gigatron::ce_reduce_scatter", mutates_args=())
def ce_reduce_scatter(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """`[world*n, ...] -> [n, ...]`: sum over ranks of this rank's chunk; wait before use."""
    x = x.contiguous()

    world = _group_size(group_name)
    shape = (x.size(0) // world, *x.shape[1:])
    out = x.new_empty(shape)

    def pull_and_sum(handle, offset, rank, world):
        chunk_offset = offset + rank * out.numel()
        parts = x.new_empty((world, *shape))
        for step in range(world):
            peer = (rank + step) % world
            parts[peer].copy_(handle.get_buffer(peer, shape, x.dtype, chunk_offset))
        torch.sum(parts, dim=0, out=out)

    return _run(x, out, group_name, pull_and_sum)


@ce_reduce_scatter.register_fake
def _(x, group_name):
    return x.new_empty((x.size(0) // _group_size(group_name), *x.shape[1:]))
