"""Run one function on N freshly spawned ranks and report the first failure with its traceback.

Used by the test suite (and usable by users) to exercise any parallel layout on a laptop:

    def body(tp):                      # module-level, so child processes can import it
        parallel_state.initialize_model_parallel(tp)
        ...

    run_distributed(body, world_size=4, args=(2,))

Processes start from a forkserver that has already imported torch and gigatron's models,
optimizer, checkpointing and training modules, so a rank starts in a fraction of a second. A rank
that raises makes the call fail at once with that rank's traceback; a rank that hangs (for
example in a collective its peers never reach) makes it fail after `timeout` seconds, and every
process is killed either way.

Return values travel back as pickles, and the parent rebuilds them through an allow-list
(`_ResultUnpickler`), never with unrestricted `pickle.loads`: built-in containers and scalars,
tensors (storages reloaded with `torch.load(weights_only=True)`), torch dtypes/devices/sizes, and
NumPy arrays, scalars and dtypes. Anything else (a dataclass, a namedtuple) is refused with an
error naming the class; pass trusted ones as `run_distributed(..., safe_globals=[MyClass])`.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from gigatron.core.untrusted_pickle import StateCheckingUnpickler

_CTX = None
# Imported once by the forkserver, so every rank forked from it starts with them loaded: a rank
# that imports the models, optimizer, checkpointing and training itself pays ~0.3 s each (about
# 1.3 s per 4-rank call on 2 cores). Modules that fail to import are skipped by multiprocessing.
_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "numpy",
    "gigatron",
    "gigatron.core.models.gpt",
    "gigatron.core.models.bert.bert_model",
    "gigatron.core.models.T5.t5_model",
    "gigatron.core.distributed",
    "gigatron.core.optimizer",
    "gigatron.core.dist_checkpointing",
    "gigatron.core.pipeline_parallel",
    "gigatron.training",
    "gigatron.training.checkpointing",
    "gigatron.training.pretrain_gpt",  # the training tests' ranks run pretrain_gpt (+ its flags)
    "gigatron.convert",  # initialize_megatron reads it; its layer specs import torch._dynamo
)


class DistributedTestError(AssertionError):
    """A rank failed or timed out inside `run_distributed`."""


# builtins a result may name: containers and scalars only (never getattr, eval, exec, ...).
_SAFE_BUILTINS = frozenset(
    {"bool", "int", "float", "complex", "str", "bytes", "bytearray"}
    | {"list", "tuple", "dict", "set", "frozenset", "slice", "range"}
)
# (module, name) pairs that tensors, NumPy arrays and NumPy scalars pickle themselves with.
_SAFE_GLOBALS = frozenset(
    {
        ("collections", "OrderedDict"),  # a tensor's backward-hook dict
        ("torch", "Size"),
        ("torch", "device"),
        ("torch", "Tensor"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"),
        ("torch._tensor", "_rebuild_from_type_v2"),  # a tensor carrying Python attributes
        ("torch.serialization", "_get_layout"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),  # NumPy 1.x spelling
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "scalar"),
    }
)


def _storage_from_bytes(data: bytes):
    """Stands in for `torch.storage._load_from_bytes`, which would `torch.load` unrestricted."""
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as e:
        # torch suggests retrying with its unrestricted loader: exactly what must not happen.
        detail = str(e).split("Trying to load", 1)[-1].strip().splitlines()[0]
        raise pickle.UnpicklingError(
            f"refusing tensor storage bytes that hold more than plain storage data: {detail}"
        ) from None


class _ResultUnpickler(StateCheckingUnpickler):
    """Unpickler whose `find_class` builds only allow-listed globals (plus `extra`); its BUILD
    sets state only on objects the result itself created (never on an allowed class or
    function, which would change it for the whole test process)."""

    def __init__(self, file, extra: dict[tuple[str, str], Any]):
        super().__init__(file)
        self._extra = extra

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._extra:
            return self._extra[(module, name)]
        if (module == "builtins" and name in _SAFE_BUILTINS) or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_from_bytes
        if module == "torch":
            import torch

            obj = vars(torch).get(name)  # vars(): no lazy-import side effects of getattr
            if isinstance(obj, (torch.dtype, torch.memory_format)):
                return obj
        raise pickle.UnpicklingError(
            f"refusing global '{module}.{name}': run_distributed results may hold only built-in "
            "containers and scalars, tensors, torch dtypes/devices/sizes and NumPy arrays/"
            "scalars/dtypes. Return plain data instead (e.g. dataclasses.asdict(x)), or, if "
            f"'{module}.{name}' is trusted, allow it with "
            f"run_distributed(..., safe_globals=[{module}.{name}])"
        )


def _load_result(data: bytes, safe_globals: Iterable[Any] = ()) -> Any:
    """Rebuild a rank's pickled return value through `_ResultUnpickler`.

    `safe_globals`: extra classes or functions the pickle may name (as `torch.load`'s
    `safe_globals`). Raises `pickle.UnpicklingError` naming the first global it refuses.
    """
    extra = {(g.__module__, g.__qualname__): g for g in safe_globals}
    return _ResultUnpickler(io.BytesIO(data), extra).load()


def _context():
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(_PRELOAD))
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
    safe_globals: Iterable[Any] = (),
) -> list[Any]:
    """Call `fn(*args, **kwargs)` on `world_size` new processes inside one process group.

    `fn` must be importable by name (defined at module level). Environment variables RANK,
    WORLD_SIZE and LOCAL_RANK are set in each rank. Returns the per-rank return values, ordered
    by rank. Raises `DistributedTestError` with the failing rank's traceback, or naming the ranks
    that did not finish within `timeout` seconds, or naming a class in a return value that is
    not allow-listed (built-in containers/scalars, tensors, NumPy arrays; add trusted classes
    or functions with `safe_globals`).
    """
    safe_globals = list(safe_globals)
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
                try:
                    values[rank] = _load_result(value, safe_globals)
                except pickle.UnpicklingError as e:
                    raise DistributedTestError(
                        f"rank {rank} of {world_size} returned a value the harness will not "
                        f"unpickle: {e}"
                    ) from None
        finally:
            done.set()
            for p in procs:
                p.join(timeout=5 if len(values) == world_size else 0.1)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    return [values[r] for r in range(world_size)]
