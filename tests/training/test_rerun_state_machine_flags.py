"""--rerun-mode / --error-injection-rate / --error-injection-type (RerunStateMachineConfig):
'disabled' and 0 (gigatron's defaults) run; any other mode or rate is refused by validate_args
with one line naming the flag and its value; the container carries the values."""

from __future__ import annotations

import pytest

from gigatron.training.argument_utils import pretrain_cfg_container_from_args
from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2",
        "--lr", "1e-3", "--mock-data", "--vocab-size", "100"]  # fmt: skip


def test_defaults_are_disabled_and_no_injection():
    args = validate_args(parse_args(argv=BASE), 1)
    assert (args.rerun_mode, args.error_injection_rate) == ("disabled", 0)
    rerun = pretrain_cfg_container_from_args(args, None).rerun_state_machine
    assert rerun.rerun_mode == "disabled" and rerun.error_injection_rate == 0
    assert rerun.error_injection_type == "transient_error"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rerun-mode", "validate_results"], "--rerun-mode validate_results: gigatron"),
        (["--rerun-mode", "report_stats"], "--rerun-mode report_stats: gigatron"),
        (["--error-injection-rate", "1000"], "--error-injection-rate 1000: gigatron"),
    ],
)
def test_modes_gigatron_does_not_run_are_refused(extra, message):
    with pytest.raises(ValueError, match=message) as e:
        validate_args(parse_args(argv=BASE + extra), 1)
    assert "\n" not in str(e.value)


def test_an_unknown_mode_is_an_argparse_error():
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--rerun-mode", "sometimes"])
