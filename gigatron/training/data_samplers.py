"""Batch samplers of Megatron's training loop, resumable from `consumed_samples`
(mirrors `megatron.training.datasets.data_samplers`).

`MegatronPretrainingSampler` (--dataloader-type single): consecutive global sample indices; each
global micro-batch of `micro_batch_size × data_parallel_size` indices is split by DP rank (rank
k takes `[k·mbs, (k+1)·mbs)`). Restarting with the same `consumed_samples` continues exactly
where a run stopped, which is what makes resume bit-exact.

`MegatronPretrainingRandomSampler` (--dataloader-type cyclic): each epoch a permutation drawn
from a generator seeded with the epoch number; `consumed_samples` gives the epoch and the
offset into it. `MegatronFullValidationSampler` (--full-validation): one sample per DP rank per
batch, every validation sample once. --dataloader-type external: the provider's object is the
loader.

With `--exit-signal-handler` the loader's worker processes ignore the exit signal: a launcher
(torchrun signals each rank's process group) or a scheduler (SLURM, Kubernetes: every process)
reaches the workers too, and a worker killed by it made the main process raise before it could
save. The main process decides; its workers stop with it.
"""

from __future__ import annotations

import random
import signal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from gigatron.core import parallel_state as ps
from gigatron.training._train_helpers import eval_batch_sizes
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


def _check_sampler(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size):
    if total_samples <= 0:
        raise ValueError(f"no samples to consume (total_samples={total_samples})")
    if micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
        raise ValueError(
            f"bad sampler settings: micro_batch_size={micro_batch_size}, "
            f"data_parallel_rank={data_parallel_rank}, data_parallel_size={data_parallel_size}"
        )


class RandomSeedDataset(Dataset):
    """`dataset` whose item i is read under seed (seed + epoch + i) for torch, numpy and random:
    random augmentations repeat per sample and change per epoch (the cyclic sampler calls
    `set_epoch`)."""

    def __init__(self, dataset, seed: int) -> None:
        self.dataset, self.base_seed, self.curr_seed = dataset, seed, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.curr_seed = self.base_seed + epoch

    def __getitem__(self, idx):
        seed = self.curr_seed + idx
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        return self.dataset[idx]


class MegatronPretrainingRandomSampler:
    """--dataloader-type cyclic: micro-batches of shuffled indices, epoch after epoch.

    An epoch covers `total_samples` less the partial last global micro-batch; epoch e's order is
    `torch.randperm` under a generator seeded with e, so it is the same on every rank and after
    a restart. `consumed_samples` (a multiple of micro_batch_size × data_parallel_size) gives the
    epoch and the offset into it, and grows as batches are yielded: iterating again starts the
    next epoch. With `data_sharding` each DP rank shuffles its own contiguous bucket of
    `total // (mbs·dp) · mbs` indices; without, one permutation of
    `total // mbs · mbs` indices is dealt round-robin to the DP ranks.
    """

    def __init__(
        self,
        dataset,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        data_sharding: bool,
    ) -> None:
        _check_sampler(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        self.dataset = dataset
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.data_sharding = data_sharding
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.last_batch_size = total_samples % self.micro_batch_times_data_parallel_size
        if total_samples < self.micro_batch_times_data_parallel_size:
            raise ValueError(
                f"total_samples ({total_samples}) < micro_batch_size ({micro_batch_size}) x "
                f"data_parallel_size ({data_parallel_size}): not one global micro-batch"
            )

    def __len__(self) -> int:
        return self.total_samples

    def _epoch_indices(self) -> list[int]:
        """This rank's sample indices for the rest of the current epoch."""
        step = self.micro_batch_times_data_parallel_size
        epoch_samples = self.total_samples - self.last_batch_size
        self.epoch, offset = divmod(self.consumed_samples, epoch_samples)
        if offset % step:
            raise ValueError(
                f"consumed_samples ({self.consumed_samples}) is not at a micro-batch boundary: "
                f"its offset in the epoch ({offset}) must be a multiple of {step}"
            )
        if isinstance(self.dataset, RandomSeedDataset):
            self.dataset.set_epoch(self.epoch)
        generator = torch.Generator().manual_seed(self.epoch)
        mbs, dp, rank = self.micro_batch_size, self.data_parallel_size, self.data_parallel_rank
        if self.data_sharding:
            bucket = (self.total_samples // step) * mbs
            order = torch.randperm(bucket, generator=generator)[offset // dp :]
            return (order + rank * bucket).tolist()
        order = torch.randperm((self.total_samples // mbs) * mbs, generator=generator)
        return order[offset:][rank::dp].tolist()

    def __iter__(self):
        indices = self._epoch_indices()
        mbs = self.micro_batch_size
        for start in range(0, len(indices) - mbs + 1, mbs):  # a partial last batch is dropped
            self.consumed_samples += self.micro_batch_times_data_parallel_size
            yield indices[start : start + mbs]


class MegatronFullValidationSampler:
    """--full-validation: every validation sample once, one per DP rank per batch (batches of
    one sample: a split smaller than the data-parallel size still evaluates); rank k reads
    samples k, k + dp, k + 2·dp, ..."""

    def __init__(self, total_samples: int, data_parallel_rank: int, data_parallel_size: int):
        _check_sampler(total_samples, 1, data_parallel_rank, data_parallel_size)
        self.total_samples = total_samples
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_size = 1

    def __len__(self) -> int:
        """Batches this rank yields."""
        return len(range(self.data_parallel_rank, self.total_samples, self.data_parallel_size))

    def __iter__(self):
        for idx in range(self.data_parallel_rank, self.total_samples, self.data_parallel_size):
            yield [idx]


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


def _dataset_split(dataset):
    """The Split a dataset declares (`split` or `index_split`, as Megatron reads it), or None."""
    return getattr(dataset, "split", None) or getattr(dataset, "index_split", None)


def _batch_sampler(dataset, consumed_samples: int, args, split):
    """Megatron's choice of sampler: the full-validation one for the validation split under
    --full-validation, else by --dataloader-type; validation and test splits in micro-batches
    of --eval-micro-batch-size."""
    from gigatron.core.datasets.utils import Split

    is_eval = split in (Split.valid, Split.test)
    mbs = eval_batch_sizes(args)[1] if is_eval else args.micro_batch_size
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    if split == Split.valid and getattr(args, "full_validation", False):
        return MegatronFullValidationSampler(len(dataset), dp_rank, dp_size)
    kind = getattr(args, "dataloader_type", None) or "single"
    if kind == "cyclic":
        return MegatronPretrainingRandomSampler(
            dataset,
            total_samples=len(dataset),
            consumed_samples=consumed_samples,
            micro_batch_size=mbs,
            data_parallel_rank=dp_rank,
            data_parallel_size=dp_size,
            data_sharding=getattr(args, "data_sharding", True),
        )
    if kind != "single":
        raise ValueError(f"--dataloader-type {kind}: one of single, cyclic, external")
    return MegatronPretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=mbs,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
    )


def build_pretraining_data_loader(
    dataset, consumed_samples: int, args, worker_init_fn=None, *, split=None
):
    """A DataLoader over `dataset` yielding this DP rank's micro-batches from `consumed_samples`.

    None for no dataset or an empty one. `--dataloader-type external`: `dataset` itself (the
    provider built the loader or iterable; Megatron's pass-through). `split` (a Split; default
    the dataset's own `split` / `index_split`) picks the validation / test batch sizes and the
    full-validation sampler. With `--exit-signal-handler` its workers ignore the exit signal
    (then run `worker_init_fn`).
    """
    if dataset is None:
        return None
    try:
        if len(dataset) == 0:  # an empty split (--eval-iters 0): no loader
            return None
    except TypeError:  # an external iterable without a length
        pass
    if getattr(args, "dataloader_type", None) == "external":
        return dataset
    sampler = _batch_sampler(dataset, consumed_samples, args, split or _dataset_split(dataset))
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
