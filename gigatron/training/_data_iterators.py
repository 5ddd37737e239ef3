"""The data half of `megatron.training.training`: loaders and iterators per split.

`build_train_valid_test_data_loaders` asks the provider for the datasets (sized by
`get_train_valid_test_num_samples`) and wraps each in `build_pretraining_data_loader`: the train
split from `consumed_train_samples`, the validation split from `consumed_valid_samples` (from 0
under --skip-train or --full-validation), the test split from 0. The validation split may be a
list of datasets (--multiple-validation-sets, which needs --full-validation, as Megatron's).

`build_train_valid_test_data_iterators` turns loaders into iterators by --dataloader-type:
`single` one pass, `cyclic` endless passes (`cyclic_iter`), `external` the provider's objects
as they are. Under --full-validation the validation loaders are cycled and `args.eval_iters`
becomes each loader's length, the MAX over the data-parallel ranks (a list with
--multiple-validation-sets), so every rank runs the same number of evaluation steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.datasets.utils import Split
from gigatron.core.rerun_state_machine import RerunDataIterator
from gigatron.training import _train_helpers as helpers
from gigatron.training.data_samplers import build_pretraining_data_loader
from gigatron.training.global_vars import get_args
from gigatron.training.utils import print_rank_0

_DATALOADER_TYPES = ("single", "cyclic", "external")


def cyclic_iter(iterable):
    """Items of `iterable`, pass after pass, forever (RuntimeError if a pass yields none)."""
    while True:
        count = 0
        for item in iterable:
            count += 1
            yield item
        if count == 0:
            raise RuntimeError(
                "cyclic_iter: the iterable produced no data (an empty validation loader, or "
                "--eval-iters set for a split with no samples)"
            )


def _valid_datasets(valid_ds) -> list:
    return valid_ds if isinstance(valid_ds, list) else [valid_ds]


def build_train_valid_test_data_loaders(train_valid_test_dataset_provider):
    """(train loader, [validation loaders], test loader); a loader is None for a split the
    provider did not give (the train loader also under --skip-train)."""
    args = get_args()
    sizes = list(helpers.num_samples(args))
    print_rank_0(" > datasets target sizes (minimum size):")
    for name, size in zip(("train:     ", "validation:", "test:      "), sizes):
        print_rank_0(f"    {name} {size}")
    train_ds, valid_ds, test_ds = train_valid_test_dataset_provider(sizes)
    skip_train = getattr(args, "skip_train", False)
    full_validation = getattr(args, "full_validation", False)
    multiple = getattr(args, "multiple_validation_sets", False)
    train_loader = None
    if not skip_train:
        train_loader = build_pretraining_data_loader(
            train_ds, args.consumed_train_samples, args, split=Split.train
        )
    if multiple and not (skip_train or full_validation):
        # each set would need its own consumed-samples count to resume (Megatron's limit too)
        raise NotImplementedError("--multiple-validation-sets currently requires --full-validation")
    valid_datasets = _valid_datasets(valid_ds)
    if not multiple and len(valid_datasets) != 1:
        raise ValueError(
            f"the provider gave {len(valid_datasets)} validation datasets: pass "
            "--multiple-validation-sets --full-validation to evaluate each"
        )
    # --skip-train reads the validation split (sized for one evaluation) from its start, not from
    # the loaded checkpoint's consumed_valid_samples (Megatron's)
    valid_start = 0 if skip_train or full_validation else args.consumed_valid_samples
    valid_loaders = [
        build_pretraining_data_loader(ds, valid_start, args, split=Split.valid)
        for ds in valid_datasets
    ]
    test_loader = build_pretraining_data_loader(test_ds, 0, args, split=Split.test)
    return train_loader, valid_loaders, test_loader


def _iterator(kind: str, loader):
    if kind == "single":
        return RerunDataIterator(iter(loader))
    if kind == "cyclic":
        return RerunDataIterator(cyclic_iter(loader))
    # external: the provider's object is the iterator (an iterable is iterated once)
    return RerunDataIterator(iter(loader))


def _full_validation_eval_iters(args, loaders: list) -> None:
    """args.eval_iters = each validation loader's length, MAX over the DP (x CP) ranks; the
    test split keeps --eval-iters (args.test_eval_iters), the count it was sized for."""
    if getattr(args, "test_eval_iters", None) is None:
        args.test_eval_iters = args.eval_iters
    if loaders[0] is None:
        args.eval_iters = [None] * len(loaders) if args.multiple_validation_sets else None
        return
    lengths = torch.tensor([len(loader) for loader in loaders], dtype=torch.long)
    if dist.is_initialized() and ps.model_parallel_is_initialized():
        if dist.get_backend() == "nccl":
            lengths = lengths.cuda()
        group = ps.get_data_parallel_group(with_context_parallel=True)
        dist.all_reduce(lengths, op=dist.ReduceOp.MAX, group=group)
    lengths = lengths.tolist()
    args.eval_iters = lengths if args.multiple_validation_sets else lengths[0]


def build_train_valid_test_data_iterators(train_valid_test_dataset_provider):
    """(train, validation, test) iterators or None; the validation one is a list of iterators
    with --multiple-validation-sets."""
    args = get_args()
    kind = getattr(args, "dataloader_type", None) or "single"
    if kind not in _DATALOADER_TYPES:
        raise ValueError(f"--dataloader-type {kind}: one of {', '.join(_DATALOADER_TYPES)}")
    train_loader, valid_loaders, test_loader = build_train_valid_test_data_loaders(
        train_valid_test_dataset_provider
    )
    full_validation = getattr(args, "full_validation", False)
    multiple = getattr(args, "multiple_validation_sets", False)
    if full_validation:
        _full_validation_eval_iters(args, valid_loaders)
    valid_kind = "cyclic" if full_validation else kind
    valid = [None if ld is None else _iterator(valid_kind, ld) for ld in valid_loaders]
    train = None if train_loader is None else _iterator(kind, train_loader)
    test = None if test_loader is None else _iterator(kind, test_loader)
    return train, (valid if multiple else valid[0]), test
