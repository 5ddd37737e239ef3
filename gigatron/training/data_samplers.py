"""Batch samplers of Megatron's training loop, resumable from `consumed_samples`.

`MegatronPretrainingSampler`: consecutive global sample indices; each global micro-batch of
`micro_batch_size × data_parallel_size` indices is split by DP rank (rank k takes
`[k·mbs, (k+1)·mbs)`). Restarting with the same `consumed_samples` continues exactly where a run
stopped, which is what makes resume bit-exact.

With `--exit-signal-handler` the loader's worker processes ignore the exit signal: a launcher
(torchrun signals each rank's process group) or a scheduler (SLURM, Kubernetes: every process)
reaches the workers too, and a worker killed by it made the main process raise before it could
save. The main process decides; its workers stop with it.
"""

from __future__ import annotations

import signal

import torch
from torch.utils.data import DataLoader

from gigatron.core import parallel_state as ps
from gigatron.training.utils import args_by_name


class MegatronPretrainingSampler:
    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        if total_samples <= 0:
            raise ValueError(f"no samples to consume (total_samples={total_samples})")
        if consumed_samples >= total_samples:
            raise ValueError(
                f"consumed_samples ({consumed_samples}) >= total_samples ({total_samples}): "
                "the dataset is exhausted"
            )
        if micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(
                f"bad sampler settings: micro_batch_size={micro_batch_size}, "
                f"data_parallel_rank={data_parallel_rank}, data_parallel_size={data_parallel_size}"
            )
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self.total_samples

    def _slice(self):
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def __iter__(self):
        batch = []
        for idx in range(self.consumed_samples, self.total_samples):
            batch.append(idx)
            if len(batch) == self.micro_batch_times_data_parallel_size:
                start, end = self._slice()
                yield batch[start:end]
                batch = []
        if batch and not self.drop_last:
            start, end = self._slice()
            yield batch[start:end]


def exit_signal_number(args) -> signal.Signals:
    """The signal `--exit-signal-handler` owns: `--exit-signal` (a name or number), SIGTERM."""
    value = getattr(args, "exit_signal", None) or signal.SIGTERM
    return signal.Signals[value] if isinstance(value, str) else signal.Signals(value)


class _IgnoreExitSignal:
    """A DataLoader `worker_init_fn`: the worker ignores `signum`, then runs `then` (if any).
    A class, not a closure, so that spawn / forkserver workers can unpickle it."""

    def __init__(self, signum: int, then=None) -> None:
        self.signum, self.then = signum, then

    def __call__(self, worker_id: int) -> None:
        signal.signal(self.signum, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)


def build_pretraining_data_loader(
    dataset, consumed_samples: int, args, worker_init_fn=None
) -> DataLoader | None:
    """A DataLoader over `dataset` yielding this DP rank's micro-batches from `consumed_samples`.

    With `--exit-signal-handler` its workers ignore the exit signal (then run `worker_init_fn`).
    """
    if dataset is None:
        return None

    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        **args_by_name(args, "micro_batch_size"),
        data_parallel_rank=ps.get_data_parallel_rank(),
        data_parallel_size=ps.get_data_parallel_world_size(),
    )
    if getattr(args, "exit_signal_handler", False) and args.num_workers > 0:
        worker_init_fn = _IgnoreExitSignal(exit_signal_number(args), worker_init_fn)
    # Each DataLoader iterator draws a base seed; from its own generator, not the global one,
    # so building the loader after a checkpoint's RNG states were restored does not move the
    # torch RNG that CPU dropout draws from (a resumed run then repeats the uninterrupted one)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        **args_by_name(args, "num_workers"),
        pin_memory=torch.cuda.is_available(),
        persistent_workers=args.num_workers > 0,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(getattr(args, "seed", 1234)),
    )
