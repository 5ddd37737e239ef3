"""Batch samplers of Megatron's training loop, resumable from `consumed_samples`.

`MegatronPretrainingSampler`: consecutive global sample indices; each global micro-batch of
`micro_batch_size × data_parallel_size` indices is split by DP rank (rank k takes
`[k·mbs, (k+1)·mbs)`). Restarting with the same `consumed_samples` continues exactly where a run
stopped, which is what makes resume bit-exact.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader


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


def build_pretraining_data_loader(dataset, consumed_samples: int, args) -> DataLoader | None:
    """A DataLoader over `dataset` yielding this DP rank's micro-batches from `consumed_samples`."""
    if dataset is None:
        return None
    from gigatron.core import parallel_state as ps

    sampler = MegatronPretrainingSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=args.micro_batch_size,
        data_parallel_rank=ps.get_data_parallel_rank(),
        data_parallel_size=ps.get_data_parallel_world_size(),
    )
    # Each DataLoader iterator draws a base seed; from its own generator, not the global one,
    # so building the loader after a checkpoint's RNG states were restored does not move the
    # torch RNG that CPU dropout draws from (a resumed run then repeats the uninterrupted one)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=args.num_workers > 0,
        generator=torch.Generator().manual_seed(getattr(args, "seed", 1234)),
    )
