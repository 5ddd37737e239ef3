"""Sample-based schedules (--train-samples): Megatron's --lr-warmup-samples /
--lr-decay-samples / --lr-wsd-decay-samples give the same learning rates as the iteration
flags at a fixed global batch, and an iteration flag with --train-samples (which was silently
ignored: no warmup at all) is an error, as is the converse."""

import pytest
import torch

from gigatron.training._config_from_args import scheduler_from_args
from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--lr", "1e-3", "--min-lr", "1e-4", "--mock-data", "--vocab-size", "100",
        "--lr-decay-style", "WSD"]  # fmt: skip


def _lrs(extra, steps=8):
    args = validate_args(parse_args(argv=BASE + extra), 1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    sched = scheduler_from_args(args, opt)
    lrs = []
    for _ in range(steps):
        sched.step(increment=args.global_batch_size)
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_sample_flags_match_iteration_flags():
    by_iters = _lrs(["--train-iters", "8", "--lr-warmup-iters", "2", "--lr-wsd-decay-iters", "3"])
    by_samples = _lrs(
        ["--train-samples", "32", "--lr-warmup-samples", "8", "--lr-wsd-decay-samples", "12"]
    )
    assert by_samples == pytest.approx(by_iters, abs=0, rel=1e-12)
    assert by_iters[0] == pytest.approx(5e-4) and by_iters[-1] == pytest.approx(1e-4)
    assert by_iters[3] == pytest.approx(1e-3) and by_iters[5] < 1e-3  # stable, then decay


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--train-samples", "32", "--lr-warmup-iters", "2"], "--lr-warmup-iters"),
        (["--train-samples", "32", "--lr-decay-iters", "6"], "--lr-decay-iters"),
        (["--train-samples", "32", "--lr-wsd-decay-iters", "3"], "--lr-wsd-decay-iters"),
        (["--train-iters", "8", "--lr-warmup-samples", "8"], "--lr-warmup-samples"),
        (["--train-iters", "8", "--lr-decay-samples", "24"], "--lr-decay-samples"),
    ],
)
def test_flag_of_the_other_unit_is_refused(extra, flag):
    with pytest.raises(ValueError, match=flag + r" \(\d+\) does not apply"):
        validate_args(parse_args(argv=BASE + extra), 1)
