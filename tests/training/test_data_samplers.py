"""The pretraining sampler: DP slicing and exact continuation from consumed_samples."""

import pytest

from gigatron.training.data_samplers import MegatronPretrainingSampler


def test_dp_ranks_take_consecutive_slices():
    batches = [list(MegatronPretrainingSampler(20, 0, 2, rank, 2)) for rank in range(2)]
    assert batches[0][:3] == [[0, 1], [4, 5], [8, 9]]
    assert batches[1][:3] == [[2, 3], [6, 7], [10, 11]]


def test_resume_continues_exactly():
    full = list(MegatronPretrainingSampler(40, 0, 2, 1, 2))
    resumed = list(MegatronPretrainingSampler(40, 12, 2, 1, 2))
    assert resumed == full[3:]


def test_errors_name_values():
    with pytest.raises(ValueError, match=r"consumed_samples \(10\) >= total_samples \(10\)"):
        MegatronPretrainingSampler(10, 10, 2, 0, 1)
    with pytest.raises(ValueError, match="data_parallel_rank=2"):
        MegatronPretrainingSampler(10, 0, 2, 2, 2)


# ---------------------------------------------------------------- --dataloader-type cyclic
def _reference_pass(total, consumed, mbs, dp, rank, sharding):
    """One pass of Megatron's random sampler, from its definition: the epoch and the offset
    into it from `consumed` (an epoch drops the partial last global micro-batch); epoch e's
    permutation from a generator seeded e; with sharding rank r shuffles its own bucket of
    total // (mbs*dp) * mbs indices (offset / dp into it), without, one permutation of
    total // mbs * mbs indices from the offset on is dealt round-robin; full batches only."""
    import torch

    active = total - total % (mbs * dp)
    epoch, offset = consumed // active, consumed % active
    gen = torch.Generator()
    gen.manual_seed(epoch)
    if sharding:
        bucket = total // (mbs * dp) * mbs
        perm = torch.randperm(bucket, generator=gen).tolist()
        mine = [rank * bucket + p for p in perm[offset // dp :]]
    else:
        perm = torch.randperm(total // mbs * mbs, generator=gen).tolist()
        mine = [p for k, p in enumerate(perm) if k >= offset and (k - offset) % dp == rank]
    batches = [mine[i : i + mbs] for i in range(0, len(mine) - mbs + 1, mbs)]
    return batches, consumed + len(batches) * mbs * dp


@pytest.mark.parametrize("sharding", [True, False])
@pytest.mark.parametrize("total, mbs, dp", [(8, 2, 1), (14, 2, 4), (23, 3, 2), (40, 1, 3)])
def test_random_sampler_passes_equal_the_reference(total, mbs, dp, sharding):
    from gigatron.training.data_samplers import MegatronPretrainingRandomSampler

    active = total - total % (mbs * dp)
    for consumed in range(0, 2 * active, mbs * dp):
        for rank in range(dp):
            sampler = MegatronPretrainingRandomSampler(
                None, total, consumed, mbs, rank, dp, sharding
            )
            expected_consumed = consumed
            for _ in range(3):  # each pass (a cyclic loader re-iterates) starts the next epoch
                expected, expected_consumed = _reference_pass(
                    total, expected_consumed, mbs, dp, rank, sharding
                )
                assert list(sampler) == expected
                assert sampler.consumed_samples == expected_consumed


def test_random_sampler_epochs_shuffle_differently_and_cover_the_ranks_buckets():
    from gigatron.training.data_samplers import MegatronPretrainingRandomSampler

    samplers = [MegatronPretrainingRandomSampler(None, 26, 0, 3, r, 2, True) for r in range(2)]
    first = [sum(list(s), []) for s in samplers]
    second = [sum(list(s), []) for s in samplers]
    assert sorted(first[0]) == list(range(12)) and sorted(first[1]) == list(range(12, 24))
    assert sorted(second[0]) == sorted(first[0]) and second[0] != first[0]
    unsharded = [MegatronPretrainingRandomSampler(None, 26, 0, 3, r, 2, False) for r in range(2)]
    dealt = [sum(list(s), []) for s in unsharded]
    assert not set(dealt[0]) & set(dealt[1]) and len(dealt[0]) == len(dealt[1]) == 12


def test_random_sampler_resumes_mid_epoch_exactly():
    from gigatron.training.data_samplers import MegatronPretrainingRandomSampler

    full = list(MegatronPretrainingRandomSampler(None, 30, 0, 2, 1, 3, True))
    resumed = list(MegatronPretrainingRandomSampler(None, 30, 12, 2, 1, 3, True))
    assert resumed == full[2:]


def test_random_sampler_errors_name_values():
    from gigatron.training.data_samplers import MegatronPretrainingRandomSampler

    with pytest.raises(ValueError, match=r"consumed_samples \(3\) is not at a micro-batch"):
        list(MegatronPretrainingRandomSampler(None, 20, 3, 2, 0, 2, True))
    with pytest.raises(ValueError, match=r"total_samples \(3\) < micro_batch_size \(2\)"):
        MegatronPretrainingRandomSampler(None, 3, 0, 2, 0, 2, True)


def test_random_seed_dataset_reseeds_per_sample_and_epoch():
    import torch

    from gigatron.training.data_samplers import MegatronPretrainingRandomSampler, RandomSeedDataset

    class _Draw:
        def __len__(self):
            return 4

        def __getitem__(self, idx):
            return float(torch.rand(()))

    ds = RandomSeedDataset(_Draw(), seed=5)
    sampler = MegatronPretrainingRandomSampler(ds, 4, 0, 2, 0, 1, True)
    list(sampler)  # epoch 0
    assert ds.curr_seed == 5
    torch.manual_seed(5 + 2)
    expected = float(torch.rand(()))
    assert ds[2] == expected
    list(sampler)  # the next pass: epoch 1
    assert ds.curr_seed == 6
    torch.manual_seed(6 + 2)
    expected_next_epoch = float(torch.rand(()))
    assert ds[2] == expected_next_epoch != expected


# ---------------------------------------------------------------- --full-validation
@pytest.mark.parametrize("total, dp", [(1, 2), (7, 3), (9, 3)])
def test_full_validation_sampler_reads_every_sample_once_one_per_rank(total, dp):
    from gigatron.training.data_samplers import MegatronFullValidationSampler

    per_rank = [list(MegatronFullValidationSampler(total, r, dp)) for r in range(dp)]
    assert sorted(i for batches in per_rank for [i] in batches) == list(range(total))
    for rank, batches in enumerate(per_rank):
        assert batches == [[i] for i in range(rank, total, dp)]
        assert len(MegatronFullValidationSampler(total, rank, dp)) == len(batches)
