"""--start-eval-at-iter (ValidationConfig.start_eval_at_iter): no periodic evaluation before
that iteration, and the validation split is sized for the evaluations that remain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gigatron.training import _train_helpers, training
from gigatron.training.arguments import build_parser
from gigatron.training.config import ValidationConfig


class _Evaluated(Exception):
    pass


def _args(**overrides):
    base = dict(
        iteration=0, eval_interval=10, eval_iters=2, start_eval_at_iter=None,
        train_iters=100, train_samples=None, global_batch_size=4,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def _evaluates_at(monkeypatch, iteration: int, **overrides) -> bool:
    args = _args(iteration=iteration, **overrides)
    monkeypatch.setattr(training, "get_args", lambda: args)

    def evaluate(*_a, **_k):
        raise _Evaluated

    monkeypatch.setattr(training, "evaluate", evaluate)
    gc = SimpleNamespace(around_evaluation=lambda: None)
    try:
        training._evaluate_on_interval(None, [], None, iter([]), gc)
    except _Evaluated:
        return True
    return False


def test_the_flag_parses_to_the_validation_field():
    assert ValidationConfig().start_eval_at_iter is None
    assert ValidationConfig(start_eval_at_iter=50).start_eval_at_iter == 50
    parser = build_parser()
    assert parser.parse_args([]).start_eval_at_iter is None
    assert parser.parse_args(["--start-eval-at-iter", "30"]).start_eval_at_iter == 30


@pytest.mark.parametrize(
    "start, iteration, runs",
    [
        (None, 10, True),
        (50, 40, False),
        (50, 50, True),
        (50, 60, True),
        (25, 20, False),
        (25, 30, True),  # the first multiple of eval_interval at or after the start
        (50, 55, False),  # off the interval: never
        (0, 10, True),
    ],
)
def test_no_evaluation_before_the_start_iteration(monkeypatch, start, iteration, runs):
    assert _evaluates_at(monkeypatch, iteration, start_eval_at_iter=start) is runs


@pytest.mark.parametrize(
    "start, periodic",
    [(None, 10), (0, 10), (1, 10), (10, 10), (11, 9), (20, 9), (25, 8), (100, 1), (101, 0)],
)
def test_validation_split_sized_for_the_evaluations_left(start, periodic):
    """Periodic evaluations at 10, 20, ..., 100 at or after `start`, plus the final one."""
    _, valid, _ = _train_helpers.num_samples(_args(start_eval_at_iter=start))
    assert valid == (periodic + 1) * 2 * 4
