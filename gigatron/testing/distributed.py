"""Run one function on N freshly spawned ranks and report the first failure with its traceback.

Used by the test suite (and usable by users) to exercise any parallel layout on a laptop:

    def body(tp):                      # module-level, so child processes can import it
        parallel_state.initialize_model_parallel(tp)
        ...

    run_distributed(body, world_size=4, args=(2,))

Processes start from a forkserver that has already imported torch, so a rank starts in well under
a second. A rank that raises makes the call fail at once with that rank's traceback; a rank that
hangs (for example in a collective its peers never reach) makes it fail after `timeout` seconds,
and every process is killed either way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_CTX = None


class DistributedTestError(AssertionError):
    """A rank failed or timed out inside `run_distributed`."""


def _context():
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "numpy", "gigatron"])
        _CTX = ctx
    return _CTX


def _worker(fn, rank, world_size, init_file, backend, timeout, args, kwargs, results, done):
    import torch
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        value = fn(*args, **kwargs)
        # Plain pickle copies tensors by value; the queue's default reducer would pass them as
        # shared-memory file descriptors, which races with this process exiting.
        results.put(("ok", rank, pickle.dumps(value)))
        # Stay connected until every rank has reported: a rank that closes its sockets early
        # can break a peer still inside init_process_group or a final collective.
        done.wait(timeout)
    except BaseException:  # report everything, including KeyboardInterrupt and SystemExit
        results.put(("error", rank, traceback.format_exc()))
    finally:
        try:
            from gigatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        except Exception:
            pass
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: tuple = (),
    kwargs: dict | None = None,
    backend: str = "gloo",
    timeout: float = 120.0,
) -> list[Any]:
    """Call `fn(*args, **kwargs)` on `world_size` new processes inside one process group.

    `fn` must be importable by name (defined at module level). Environment variables RANK,
    WORLD_SIZE and LOCAL_RANK are set in each rank. Returns the per-rank return values, ordered
    by rank. Raises `DistributedTestError` with the failing rank's traceback, or naming the ranks
    that did not finish within `timeout` seconds.
    """
    ctx = _context()
    results = ctx.Queue()
    done = ctx.Event()
    with tempfile.TemporaryDirectory(prefix="gigatron-dist-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    fn,
                    r,
                    world_size,
                    init_file,
                    backend,
                    timeout,
                    args,
                    kwargs or {},
                    results,
                    done,
                ),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        values: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(values) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise DistributedTestError(
                        f"ranks {missing} of {world_size} did not finish within {timeout:.0f} s "
                        "(a hung collective?)"
                    )
                try:
                    status, rank, value = results.get(timeout=min(left, 1.0))
                except queue_mod.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    dead = [r for r in dead if r not in values]
                    if dead:
                        # A rank died without reporting (segfault, os._exit): give its report a
                        # moment to arrive, then fail.
                        try:
                            status, rank, value = results.get(timeout=2.0)
                        except queue_mod.Empty:
                            raise DistributedTestError(
                                f"rank {dead[0]} of {world_size} exited with code "
                                f"{procs[dead[0]].exitcode} without reporting"
                            ) from None
                    else:
                        continue
                if status == "error":
                    raise DistributedTestError(f"rank {rank} of {world_size} failed:\n{value}")
                # Bytes pickled by our own child process just above (never external input).
                values[rank] = pickle.loads(value)
        finally:
            done.set()
            for p in procs:
                p.join(timeout=5 if len(values) == world_size else 0.1)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    return [values[r] for r in range(world_size)]
