"""pretrain_t5.main on a tiny generated corpus: the span-corruption loss falls. The default suite
runs 30 steps; the slow test runs 300."""

import pytest

from gigatron.testing import run_distributed
from tests.training._bert_t5_cases import corpus_args, train_history

pytestmark = pytest.mark.multirank


def _args(tmp, iters):
    flags = ["--encoder-seq-length", "32", "--decoder-seq-length", "16"]
    return corpus_args(tmp, iters, flags + ["--lr", "1e-2", "--min-lr", "1e-3"])


def _train(tmp, iters):
    history = train_history("pretrain_t5", _args(tmp, iters))
    return [h["losses"]["lm loss"] for h in history]


def _check(lm, window, drop):
    first, last = sum(lm[:window]) / window, sum(lm[-window:]) / window
    print(f"t5 lm loss {first:.3f} -> {last:.3f}")
    assert last < first - drop, (first, last)
    return last


def test_t5_loss_falls_in_30_steps(tmp_path):
    (lm,) = run_distributed(_train, 1, args=(str(tmp_path), 30), timeout=300)
    assert len(lm) == 30
    _check(lm, 5, 0.3)


@pytest.mark.slow
def test_t5_loss_falls_in_300_steps(tmp_path):
    (lm,) = run_distributed(_train, 1, args=(str(tmp_path), 300), timeout=600)
    assert _check(lm, 20, 1.0) < 2.0


def _losses(tmp, extra):
    history = train_history("pretrain_t5", _args(tmp, 3) + extra)
    return [h["losses"].get("lm loss") for h in history]


def test_t5_tp2_training_matches_one_rank(tmp_path):
    """Same flags on 1 rank and on TP=2: the losses of 3 steps agree."""
    (reference,) = run_distributed(_losses, 1, args=(str(tmp_path / "a"), []), timeout=300)
    layout = run_distributed(
        _losses, 2, args=(str(tmp_path / "b"), ["--tensor-model-parallel-size", "2"]), timeout=300
    )
    for losses in layout:
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5, (losses, reference)
