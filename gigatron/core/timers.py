"""Named wall-clock timers, as `megatron.core.timers.Timers` offers to schedules and training.

`timers("forward-compute", log_level=2).start()` / `.stop()`; `timers.log(names)` prints the
max over ranks. Timers above `log_level` are no-ops. CUDA work is synchronised before reading
the clock when a GPU is in use, so the numbers mean what they say.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class _Timer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.elapsed_ = 0.0
        self.started = False
        self._start = 0.0

    def start(self, barrier: bool = False) -> None:
        if self.started:
            raise RuntimeError(f"timer {self.name!r} has already been started")
        if barrier and dist.is_initialized():
            dist.barrier()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self._start = time.perf_counter()
        self.started = True

    def stop(self, barrier: bool = False) -> None:
        if not self.started:
            raise RuntimeError(f"timer {self.name!r} is not started")
        if barrier and dist.is_initialized():
            dist.barrier()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.elapsed_ += time.perf_counter() - self._start
        self.started = False

    def reset(self) -> None:
        self.elapsed_ = 0.0
        self.started = False

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Seconds accumulated (including a running interval); optionally reset."""
        running = self.started
        if running:
            self.stop(barrier=barrier)
        value = self.elapsed_
        if reset:
            self.reset()
        if running:
            self.start(barrier=barrier)
        return value


class _NullTimer:
    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass

    def reset(self) -> None:
        pass

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        return 0.0


class Timers:
    """A registry of timers with Megatron's call style."""

    def __init__(self, log_level: int = 0, log_option: str = "minmax") -> None:
        self._log_level = log_level
        self._log_option = log_option
        self._timers: dict[str, _Timer] = {}
        self._null = _NullTimer()

    def __call__(self, name: str, log_level: int | None = None):
        if log_level is not None and log_level > self._log_level:
            return self._null
        if name not in self._timers:
            self._timers[name] = _Timer(name)
        return self._timers[name]

    def _max_seconds(self, names, reset: bool, barrier: bool) -> list[float]:
        """Each named timer's seconds, max over ranks (0 where no rank ran it); collective."""
        values = torch.tensor(
            [
                self._timers[n].elapsed(reset=reset, barrier=barrier) if n in self._timers else 0.0
                for n in names
            ],
            dtype=torch.float64,
        )
        if dist.is_initialized() and len(names):
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values.tolist()

    def get_all_timers_string(
        self, names=None, normalizer: float = 1.0, reset: bool = True, barrier: bool = False
    ) -> str:
        """One line of the timers in `names` (all when None), max over ranks in ms / normalizer.
        `barrier`: a barrier before each timer is read (Megatron's flag)."""
        names = list(self._timers) if names is None else [n for n in names if n in self._timers]
        values = self._max_seconds(names, reset, barrier)
        parts = [f"{n}: {v * 1000.0 / normalizer:.2f}" for n, v in zip(names, values)]
        return "(max over ranks, ms) " + " | ".join(parts)

    def log(
        self,
        names=None,
        rank=None,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> None:
        text = self.get_all_timers_string(names, normalizer, reset, barrier)
        if rank is None:
            rank = dist.get_world_size() - 1 if dist.is_initialized() else 0
        if not dist.is_initialized() or dist.get_rank() == rank:
            print(text, flush=True)

    def write(
        self,
        names,
        writer,
        iteration: int,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> None:
        """Megatron's TensorBoard / W&B export: `<name>-time` = max over ranks of the timer's
        seconds / normalizer, for timers some rank ran. Collective (every rank calls it); a
        `writer` of None (ranks that do not log) only takes part in the reduction."""
        if normalizer <= 0.0:
            raise ValueError(f"normalizer ({normalizer}) must be > 0")
        values = self._max_seconds(list(names), reset, barrier)
        if writer is None:
            return
        for name, value in zip(names, values):
            if value <= 0.0:
                continue
            if hasattr(writer, "add_scalar"):  # torch.utils.tensorboard.SummaryWriter
                writer.add_scalar(name + "-time", value / normalizer, iteration)
            else:  # wandb (the module or a run)
                writer.log({name + "-time": value / normalizer}, iteration)
