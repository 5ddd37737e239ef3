"""pretrain_bert.main / pretrain_t5.main on a tiny generated corpus: the loss falls (BERT's
masked-LM loss, with the next-sentence loss trained and reported: the A/B segments of this corpus
share a topic, so it stays near ln 2; T5's span-corruption loss), and a parallel layout trains like
one rank. The default suite runs 30 steps; the slow tests run 300."""

import pytest

from gigatron.testing import run_distributed
from tests.training._bert_t5_cases import corpus_args, train_history

pytestmark = pytest.mark.multirank

TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]

# entry point, its model flags, (window, drop) of the 30- and 300-step checks and the 300-step
# bound on the last window's mean
MODELS = {
    "bert": dict(
        entry="pretrain_bert",
        flags=["--seq-length", "32", "--lr", "3e-3", "--min-lr", "3e-4"],
        # 30 steps get below the unigram level (ln 64 = 4.16 -> ~3.9); the slow run learns context
        short=(5, 0.2),
        long=(20, 1.0),
        long_last=2.2,
    ),
    "t5": dict(
        entry="pretrain_t5",
        flags=["--encoder-seq-length", "32", "--decoder-seq-length", "16"]
        + ["--lr", "1e-2", "--min-lr", "1e-3"],
        short=(5, 0.3),
        long=(20, 1.0),
        long_last=2.0,
    ),
}


def _args(model, tmp, iters):
    return corpus_args(tmp, iters, MODELS[model]["flags"])


def _train(model, tmp, iters):
    history = train_history(MODELS[model]["entry"], _args(model, tmp, iters))
    if model == "bert":
        assert all("sop loss" in h["losses"] for h in history)  # trained and reported
    return [h["losses"] for h in history]


def _check(model, history, window, drop):
    lm = [h["lm loss"] for h in history]
    first, last = sum(lm[:window]) / window, sum(lm[-window:]) / window
    sop = [h["sop loss"] for h in history] if model == "bert" else None
    print(
        f"{model} lm loss {first:.3f} -> {last:.3f}"
        + (f"; sop {sop[0]:.3f} -> {sop[-1]:.3f}" if sop else "")
    )
    assert last < first - drop, (first, last)
    return last


@pytest.mark.parametrize("model", MODELS)
def test_loss_falls_in_30_steps(tmp_path, model):
    (history,) = run_distributed(_train, 1, args=(model, str(tmp_path), 30), timeout=300)
    assert len(history) == 30
    _check(model, history, *MODELS[model]["short"])


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_loss_falls_in_300_steps(tmp_path, model):
    (history,) = run_distributed(_train, 1, args=(model, str(tmp_path), 300), timeout=600)
    assert _check(model, history, *MODELS[model]["long"]) < MODELS[model]["long_last"]


def _losses(model, tmp, extra):
    args = _args(model, tmp, 3) + extra
    if model == "bert":
        args[args.index("--micro-batch-size") + 1] = "4"  # 4 microbatches (pipeline-friendly)
    return [h["losses"].get("lm loss") for h in train_history(MODELS[model]["entry"], args)]


@pytest.mark.parametrize(
    "model, layout, world_size", [("bert", TP2 + PP2, 4), ("t5", TP2, 2)], ids=["bert", "t5"]
)
def test_parallel_layout_trains_like_one_rank(tmp_path, model, layout, world_size):
    """Same flags on 1 rank and on the layout (BERT TP2 x PP2, T5 TP2): the same initial model
    (layout-invariant init) and data, so the losses of 3 steps agree on every rank of the last
    stage (both TP ranks)."""
    args = (model, str(tmp_path / "a"), [])
    (reference,) = run_distributed(_losses, 1, args=args, timeout=300)
    args = (model, str(tmp_path / "b"), layout)
    layout_losses = run_distributed(_losses, world_size, args=args, timeout=300)
    last_stage = [r for r in layout_losses if r[0] is not None]
    assert len(last_stage) == 2
    for losses in last_stage:
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5, (losses, reference)
