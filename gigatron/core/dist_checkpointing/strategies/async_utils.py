"""Background checkpoint writes.

Mirrors `megatron.core.dist_checkpointing.strategies.async_utils` (AsyncRequest,
AsyncCallsQueue). An AsyncRequest is `async_fn(*async_fn_args)` (file I/O only, run in a
background thread) followed by `finalize_fns` (collective, run on the caller's thread by
`maybe_finalize_async_calls`). gigatron uses one thread per request instead of Megatron's
persistent worker process; the bytes written are those of a synchronous save.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from gigatron.core.dist_checkpointing.core import CheckpointingException, describe_write_error

__all__ = ["AsyncCallsQueue", "AsyncRequest", "AsyncWriteError"]


class AsyncWriteError(CheckpointingException, RuntimeError):
    """A background write failed on some rank; raised on every rank, nothing finalized."""


@dataclass
class AsyncRequest:
    """Work for a background writer and what to do once every rank's write has finished."""

    async_fn: Callable | None
    async_fn_args: tuple
    finalize_fns: list[Callable] = field(default_factory=list)
    preload_fn: Callable | None = None

    def add_finalize_fn(self, fn: Callable) -> None:
        self.finalize_fns.append(fn)

    def execute_sync(self) -> None:
        """Run everything now on this thread (what a synchronous save does)."""
        if self.preload_fn is not None:
            self.preload_fn()
        if self.async_fn is not None:
            self.async_fn(*self.async_fn_args)
        for fn in self.finalize_fns:
            fn()


class _Call:
    def __init__(self, request: AsyncRequest):
        self.request = request
        self.error: BaseException | None = None
        if request.preload_fn is not None:
            request.preload_fn()  # staging copies happen before training continues
        self.thread = threading.Thread(target=self._run, daemon=True, name="gigatron-ckpt-write")
        self.thread.start()

    def _run(self):
        try:
            if self.request.async_fn is not None:
                self.request.async_fn(*self.request.async_fn_args)
        except BaseException as e:  # reported on finalize
            self.error = e


class AsyncCallsQueue:
    """Schedule AsyncRequests; finalize them (collectively) once all ranks finished writing."""

    def __init__(self, persistent: bool = False):
        # Megatron's `persistent` keeps one worker process alive between saves; gigatron writes
        # in a thread per save either way, so it only changes where the work runs, not results.
        self.persistent = persistent
        self._calls: list[_Call] = []

    def schedule_async_request(self, async_request: AsyncRequest) -> int:
        self._calls.append(_Call(async_request))
        return len(self._calls) - 1

    def get_num_unfinalized_calls(self) -> int:
        return len(self._calls)

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> list:
        """Finalize the oldest calls whose writes are done on every rank (all if `blocking`)."""
        done = []
        while self._calls:
            call = self._calls[0]
            if blocking:
                call.thread.join()
            finished = not call.thread.is_alive()
            if not no_dist and dist.is_available() and dist.is_initialized():
                out = [None] * dist.get_world_size()
                dist.all_gather_object(out, finished)
                finished = all(out)
            if not finished:
                break
            call.thread.join()
            self._calls.pop(0)
            causes = [None if call.error is None else describe_write_error(call.error)]
            if not no_dist and dist.is_available() and dist.is_initialized():
                out = [None] * dist.get_world_size()
                dist.all_gather_object(out, causes[0])
                causes = out
            failed = [(r, c) for r, c in enumerate(causes) if c is not None]
            if failed:  # every rank raises the same line: none waits in a finalize collective
                raise AsyncWriteError(
                    f"background checkpoint write failed on ranks {[r for r, _ in failed]} "
                    f"({failed[0][1]}); nothing was finalized"
                ) from call.error
            for fn in call.request.finalize_fns:
                fn()
            done.append(call)
        return done

    def close(self, abort: bool = False) -> None:
        """Finish and finalize every pending save; `abort=True` (Megatron's, for a failing job)
        drops them unfinalized instead: no collective runs and metadata.json is not written."""
        if abort:
            self._calls.clear()
            return
        self.maybe_finalize_async_calls(blocking=True)
