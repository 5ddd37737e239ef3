"""Flag values that divided by zero or ran without their prerequisite (issue 28, item 7): each is
refused by validate_args, before any process group exists (so on every rank alike), with one
line naming the flag, its value and the rule."""

import pytest

from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-3", "--mock-data", "--vocab-size", "100"]  # fmt: skip


def _validate(extra, world_size=1):
    return validate_args(parse_args(argv=BASE + extra), world_size)


@pytest.mark.parametrize(
    "extra, world_size, message",
    [
        # sizes that divide something: ZeroDivisionError or a negative size before
        (["--micro-batch-size", "0"], 1, "--micro-batch-size (0) must be >= 1"),
        (["--micro-batch-size", "-2"], 1, "--micro-batch-size (-2) must be >= 1"),
        (["--global-batch-size", "0"], 1, "--global-batch-size (0) must be >= 1"),
        (["--tensor-model-parallel-size", "0"], 2, "--tensor-model-parallel-size (0) must be >= 1"),
        (["--pipeline-model-parallel-size", "0"], 2, "--pipeline-model-parallel-size (0) must"),
        (["--context-parallel-size", "0"], 2, "--context-parallel-size (0) must be >= 1"),
        (["--expert-model-parallel-size", "0"], 2, "--expert-model-parallel-size (0) must be >= 1"),
        (["--num-attention-heads", "0"], 1, "--num-attention-heads (0) must be >= 1"),
        (["--num-layers", "0"], 1, "--num-layers (0) must be >= 1"),
        (["--hidden-size", "0"], 1, "--hidden-size (0) must be >= 1"),
        (["--seq-length", "0"], 1, "--seq-length (0) must be >= 1"),
        (["--kv-channels", "0"], 1, "--kv-channels (0) must be >= 1"),
        (["--ffn-hidden-size", "0"], 1, "--ffn-hidden-size (0) must be >= 1"),
        (["--make-vocab-size-divisible-by", "0"], 1, "--make-vocab-size-divisible-by (0) must"),
        (["--log-interval", "0"], 1, "--log-interval (0) must be >= 1"),
        (
            ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "0"],
            2,
            "--num-layers-per-virtual-pipeline-stage (0) must be >= 1",
        ),
        (
            ["--rampup-batch-size", "2", "2", "0"],
            1,
            "--rampup-batch-size samples (0) must be an integer",
        ),
        (["--train-iters", "-1"], 1, "--train-iters (-1) must be >= 0"),
        (["--eval-iters", "-1"], 1, "--eval-iters (-1) must be >= 0"),
        (["--eval-interval", "-1"], 1, "--eval-interval (-1) must be >= 0"),
        (["--num-workers", "-1"], 1, "--num-workers (-1) must be >= 0"),
        # accepted without the flag they need
        (["--expert-model-parallel-size", "2"], 2, "--expert-model-parallel-size 2 needs"),
        (["--moe-router-topk", "4"], 1, "--moe-router-topk needs --num-experts"),
        (["--moe-grouped-gemm"], 1, "--moe-grouped-gemm needs --num-experts"),
        (["--moe-aux-loss-coeff", "0.01"], 1, "--moe-aux-loss-coeff needs --num-experts"),
        (["--moe-ffn-hidden-size", "16"], 1, "--moe-ffn-hidden-size needs --num-experts"),
        (["--num-experts", "3", "--expert-model-parallel-size", "2"], 2, "--num-experts (3) must"),
        (["--num-experts", "4", "--moe-router-topk", "0"], 1, "--moe-router-topk (0) must be"),
        (["--num-experts", "4", "--moe-router-topk", "8"], 1, "--moe-router-topk (8) must be"),
        (
            ["--num-layers-per-virtual-pipeline-stage", "1"],
            1,
            "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1",
        ),
        (
            ["--virtual-pipeline-model-parallel-size", "2"],
            1,
            "--virtual-pipeline-model-parallel-size needs --pipeline-model-parallel-size > 1",
        ),
    ],
)
def test_bad_value_is_one_line_naming_the_flag(extra, world_size, message):
    with pytest.raises(ValueError) as err:
        _validate(extra, world_size)
    text = str(err.value)
    assert message in text and "\n" not in text, text
    assert "gigatron/" not in text, text  # the user's flag, not gigatron's source path


def test_good_values_still_pass():
    """The boundaries stay accepted: Megatron's 0-means-off flags, EP with its experts."""
    args = _validate(["--num-experts", "4", "--expert-model-parallel-size", "2"], 2)
    assert args.expert_model_parallel_size == 2 and args.data_parallel_size == 2
    args = _validate(["--eval-iters", "0", "--eval-interval", "0", "--train-iters", "0"])
    assert args.eval_iters == 0 and args.train_iters == 0
    args = _validate(["--num-experts", "4", "--moe-router-topk", "4", "--moe-grouped-gemm"])
    assert args.moe_router_topk == 4
    args = _validate(["--save-interval", "0", "--exit-interval", "0", "--num-workers", "0"])
    assert args.save_interval == 0
    argv = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]
    assert _validate(argv, 2).virtual_pipeline_model_parallel_size is None  # 1 layer per stage
    argv = ["--rampup-batch-size", "2", "2", "8", "--global-batch-size", "4"]
    assert _validate(argv).rampup_batch_size == ["2", "2", "8"]


@pytest.mark.parametrize(
    "flag, value, rule",
    [("--lr", "nan", ">= 0"), ("--lr", "-1e-3", ">= 0"), ("--min-lr", "inf", ">= 0"),
     ("--weight-decay", "-0.1", ">= 0"), ("--clip-grad", "nan", ">= 0"),
     ("--adam-beta1", "1.0", "in [0, 1)"), ("--adam-beta2", "nan", "in [0, 1)"),
     ("--adam-eps", "-1e-8", ">= 0"), ("--sgd-momentum", "-0.9", ">= 0"),
     ("--loss-scale", "0", "> 0"), ("--initial-loss-scale", "nan", "> 0"),
     ("--lr-warmup-fraction", "1.5", "in [0, 1]")],
)  # fmt: skip
def test_float_flags_outside_their_range_are_refused(flag, value, rule):
    """NaN / negative optimizer values were accepted and trained on NaN (or not at all)."""
    with pytest.raises(ValueError, match=rf"^{flag} \({float(value)}\) must be a finite number "):
        _validate([f"{flag}={value}"])
