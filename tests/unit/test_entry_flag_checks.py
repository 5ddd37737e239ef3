"""Flag combinations pretrain_gpt ran while silently ignoring one of them (QA audit,
session 9): --reset-attention-mask under context parallelism (CP attention is causal over the
whole sequence; the run's losses equalled those without the flag)."""

import pytest

from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-3", "--mock-data", "--vocab-size", "100"]  # fmt: skip


def test_reset_attention_mask_refused_under_context_parallelism():
    argv = BASE + ["--reset-attention-mask", "--context-parallel-size", "2"]
    with pytest.raises(ValueError, match="--reset-attention-mask with --context-parallel-size 2"):
        validate_args(parse_args(argv=argv), 2)


def test_reset_flags_still_accepted_where_they_work():
    args = validate_args(parse_args(argv=BASE + ["--reset-attention-mask"]), 2)
    assert args.reset_attention_mask and args.data_parallel_size == 2
    argv = BASE + ["--reset-position-ids", "--context-parallel-size", "2"]
    assert validate_args(parse_args(argv=argv), 2).reset_position_ids
