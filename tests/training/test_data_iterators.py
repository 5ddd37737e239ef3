"""Megatron's data iterators per --dataloader-type: `external` passes the provider's objects
through (no sampler), `cyclic` starts a new shuffled epoch when one ends, and --full-validation
with --multiple-validation-sets gives one cycled iterator per validation set with
`args.eval_iters` each loader's length, the MAX over the data-parallel ranks. Validation and
test loaders read micro-batches of --eval-micro-batch-size."""

from types import SimpleNamespace

import pytest

from gigatron.core.datasets.utils import Split
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _args(**overrides):
    args = SimpleNamespace(
        iteration=0,
        train_samples=None,
        train_iters=3,
        eval_interval=1000,
        eval_iters=2,
        global_batch_size=4,
        micro_batch_size=2,
        eval_global_batch_size=6,
        eval_micro_batch_size=3,
        consumed_train_samples=0,
        consumed_valid_samples=0,
        dataloader_type="single",
        data_sharding=True,
        skip_train=False,
        start_eval_at_iter=None,
        full_validation=False,
        multiple_validation_sets=False,
        num_workers=0,
        seed=1,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class _Indices:
    """A map-style dataset whose item i is i, declaring its split as Megatron's datasets do."""

    def __init__(self, n: int, split: Split) -> None:
        self.n, self.index_split = n, split

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> int:
        return idx


def _build(args, provider):
    from gigatron.training import global_vars
    from gigatron.training.training import build_train_valid_test_data_iterators

    global_vars.set_args(args)
    try:
        return build_train_valid_test_data_iterators(provider)
    finally:
        global_vars.set_args(None)


def _loaders_on_ranks():
    """On 2 DP ranks: a cyclic train split, two validation sets under full validation, a test
    split in eval micro-batches."""
    import torch

    from gigatron.core import parallel_state as ps

    ps.initialize_model_parallel()

    def provider(sizes):
        train = _Indices(10, Split.train)
        valid = [_Indices(5, Split.valid), _Indices(2, Split.valid)]
        return train, valid, _Indices(12, Split.test)

    args = _args(dataloader_type="cyclic", full_validation=True, multiple_validation_sets=True)
    train, valid, test = _build(args, provider)
    train_batches = [next(train).tolist() for _ in range(6)]  # 2 per epoch of 4 samples / rank
    valid_items = [[next(it).tolist() for _ in range(4)] for it in valid]
    test_batch = next(test).tolist()
    ps.destroy_model_parallel()
    return torch.distributed.get_rank(), train_batches, args.eval_iters, valid_items, test_batch


def _epoch_order(epoch: int, n: int) -> list[int]:
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()


def test_full_validation_sets_on_two_ranks_take_the_max_length_and_cycle():
    results = run_distributed(_loaders_on_ranks, 2)
    for rank, train_batches, eval_iters, valid_items, test_batch in results:
        # set 0: 5 samples -> rank 0 reads [0], [2], [4], rank 1 reads [1], [3]; set 1: 1 each
        assert eval_iters == [3, 1]
        if rank == 0:
            assert valid_items == [[[0], [2], [4], [0]], [[0], [0], [0], [0]]]
        else:
            assert valid_items == [[[1], [3], [1], [3]], [[1], [1], [1], [1]]]
        # sharded cyclic train split (10 samples, micro-batch 2, 2 ranks): rank r shuffles its
        # bucket 4r..4r+3 with epoch e's permutation, epoch after epoch
        expected = [4 * rank + i for e in range(3) for i in _epoch_order(e, 4)]
        assert train_batches == [expected[i : i + 2] for i in range(0, 12, 2)]
        # the test split in micro-batches of --eval-micro-batch-size 3 from rank r's bucket of 6
        assert test_batch == [6 * rank + i for i in _epoch_order(0, 6)[:3]]


def _external_on_one_rank():
    from gigatron.core import parallel_state as ps
    from gigatron.training.data_samplers import build_pretraining_data_loader

    ps.initialize_model_parallel()
    loader = object.__new__(type("Loader", (), {"__iter__": lambda self: iter([7, 8])}))
    args = _args(dataloader_type="external")
    passed = build_pretraining_data_loader(loader, 0, args) is loader
    train, valid, test = _build(args, lambda sizes: (iter([1]), loader, iter([3])))
    out = passed, next(train), list(valid), next(test)
    ps.destroy_model_parallel()
    return out


def test_external_loaders_pass_through_as_the_provider_built_them():
    ((passed, train, valid, test),) = run_distributed(_external_on_one_rank, 1)
    assert passed and (train, valid, test) == (1, [7, 8], 3)


def test_multiple_validation_sets_without_full_validation_is_refused():
    args = _args(dataloader_type="external", multiple_validation_sets=True)
    with pytest.raises(NotImplementedError, match="requires --full-validation"):
        _build(args, lambda sizes: (None, [iter([1]), iter([2])], None))
