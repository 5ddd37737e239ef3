"""When the training loop stops early: the exit signal, `--exit-duration-in-mins`,
`--exit-interval`.

Mirrors the exit checks after each step of `megatron.training.training` (the signal side of
Megatron's `dist_signal_handler.DistributedSignalHandler`): the loop asks `exit_reason` after
every iteration and, given a reason, saves a checkpoint and stops on every rank at that step.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist


class ExitSignal:
    """Remembers the exit signal (SIGTERM, or `--exit-signal`) so the loop can save and stop at
    a step boundary. DataLoader workers ignore it (`build_pretraining_data_loader`)."""

    def __init__(self, enabled: bool, signum: int = signal.SIGTERM) -> None:
        self.received = False
        self.name = signal.Signals(signum).name
        self._signum, self._previous = signum, None
        if enabled:
            self._previous = signal.signal(signum, self._handler)

    def _handler(self, signum, frame) -> None:
        self.received = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(self._signum, self._previous)


def any_rank(*flags: bool) -> list[bool]:
    """Each flag OR-ed over all ranks (one all-reduce)."""
    t = torch.tensor(
        [1.0 if f else 0.0 for f in flags],
        device="cuda" if dist.get_backend() == "nccl" else "cpu",
    )
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def exit_reason(args, exit_signal: ExitSignal, start_time: float, iteration: int) -> str | None:
    """Why the loop stops after `iteration` (None: it goes on), the same on every rank: the
    exit signal on any rank, `--exit-duration-in-mins` passed on any rank, `--exit-interval`."""
    out_of_time = (
        args.exit_duration_in_mins is not None
        and (time.time() - start_time) / 60.0 > args.exit_duration_in_mins
    )
    # Agreed over ranks only when an exit condition is armed (a collective and a host sync
    # each iteration otherwise, as Megatron also skips them); the reason agreed too: a rank
    # that was not signalled names the signal as well
    armed = args.exit_signal_handler or args.exit_duration_in_mins is not None
    signalled, out_of_time = (
        any_rank(exit_signal.received, out_of_time) if armed else (False, False)
    )
    if signalled:
        return f"{exit_signal.name} received"
    if out_of_time:
        return "exit duration reached"
    if args.exit_interval and iteration % args.exit_interval == 0:
        return "--exit-interval"
    return None
