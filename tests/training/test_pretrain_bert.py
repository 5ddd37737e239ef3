"""pretrain_bert.main on a tiny generated corpus: the masked-LM loss falls (the next-sentence
loss is trained and reported; the A/B segments of this corpus share a topic, so it stays near
ln 2). The default suite runs 30 steps; the slow test runs 300."""

import pytest

from gigatron.testing import run_distributed
from tests.training._bert_t5_cases import corpus_args, train_history

pytestmark = pytest.mark.multirank


def _args(tmp, iters):
    return corpus_args(tmp, iters, ["--seq-length", "32", "--lr", "3e-3", "--min-lr", "3e-4"])


def _train(tmp, iters):
    history = train_history("pretrain_bert", _args(tmp, iters))
    return [(h["losses"]["lm loss"], h["losses"]["sop loss"]) for h in history]


def _check(history, window, drop):
    lm = [h[0] for h in history]
    sop = [h[1] for h in history]
    first, last = sum(lm[:window]) / window, sum(lm[-window:]) / window
    print(f"lm loss {first:.3f} -> {last:.3f}; sop loss {sop[0]:.3f} -> {sop[-1]:.3f}")
    assert last < first - drop, (first, last)
    return first, last, sop


def test_bert_loss_falls_in_30_steps(tmp_path):
    (history,) = run_distributed(_train, 1, args=(str(tmp_path), 30), timeout=300)
    assert len(history) == 30
    # 30 steps get below the unigram level (ln 64 = 4.16 -> ~3.9); the slow run learns context.
    _check(history, 5, 0.2)


@pytest.mark.slow
def test_bert_loss_falls_in_300_steps(tmp_path):
    (history,) = run_distributed(_train, 1, args=(str(tmp_path), 300), timeout=600)
    _, last, _ = _check(history, 20, 1.0)
    assert last < 2.2


def _losses(tmp, extra):
    args = _args(tmp, 3) + extra
    args[args.index("--micro-batch-size") + 1] = "4"  # 4 microbatches (pipeline-friendly)
    return [h["losses"].get("lm loss") for h in train_history("pretrain_bert", args)]


def test_bert_tp2_pp2_training_matches_one_rank(tmp_path):
    """Same flags on 1 rank and on TP2 x PP2: the same initial model (layout-invariant init)
    and data, so the losses of 3 steps agree."""
    (reference,) = run_distributed(_losses, 1, args=(str(tmp_path / "a"), []), timeout=300)
    layout = run_distributed(
        _losses,
        4,
        args=(
            str(tmp_path / "b"),
            ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
        ),
        timeout=300,
    )
    last_stage = [r for r in layout if r[0] is not None]
    assert len(last_stage) == 2
    for losses in last_stage:
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5, (losses, reference)
