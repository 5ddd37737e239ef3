"""Megatron's end of `pretrain()`: after the last training iteration, one evaluation of the
validation split ("validation loss at iteration N on validation set | ...") then one of the test
split ("... on test set | ..."), where the split exists and --eval-iters > 0; none when an exit
condition stopped the loop (Megatron exits inside train()). A small corpus whose test split
rounds to no sequences under the default --split 969,30,1 stops with an error naming the fix
(Megatron loops forever there); --eval-iters 0 requests nothing from it."""

import pytest

from gigatron.testing import run_distributed
from tests.training._gpt_runs import run_pretrain_gpt, small_mock_corpus

pytestmark = pytest.mark.multirank


ARGS = [
    "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
    "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
    "--log-interval", "100", "--no-progress-bar", "--num-workers", "0",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
]  # fmt: skip


def _pretrain(argv):
    """(printed lines, result) of one pretrain_gpt run in this process."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run_pretrain_gpt(argv)
    return out.getvalue().splitlines(), result


def _test_loss_by_hand(model, eval_iters: int) -> float:
    """Token-mean LM loss of the test split's first eval_iters * global_batch_size samples, the
    samples the test loader reads first, in one forward of the unwrapped model (no schedule,
    sampler or evaluate())."""
    import torch

    from gigatron.training import pretrain_gpt, training
    from gigatron.training.global_vars import get_args

    args = get_args()
    sizes = training.get_train_valid_test_num_samples()
    with small_mock_corpus():  # the corpus run_pretrain_gpt trained and evaluated on
        _, _, test_ds = pretrain_gpt.train_valid_test_datasets_provider(sizes)
    samples = [test_ds[i] for i in range(eval_iters * args.global_batch_size)]
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "loss_mask")}
    module = model[0].module
    module.eval()
    with torch.no_grad():
        positions = torch.arange(batch["tokens"].shape[1]).expand_as(batch["tokens"])
        losses = module(batch["tokens"], positions, None, labels=batch["labels"])  # [b, s]
    mask = batch["loss_mask"]
    return float((losses.float() * mask).sum() / mask.sum())


def _value(line: str) -> float:
    return float(line.split("lm loss value: ")[1].split(" |")[0])


def _normal_and_exit_runs():
    """A run to --train-iters (the loop also evaluates its last iteration), then one stopped by
    --exit-interval."""
    eval_flags = ["--eval-interval", "2", "--eval-iters", "2", "--mock-data"]
    lines, result = _pretrain(ARGS + eval_flags + ["--train-iters", "2"])
    by_hand = _test_loss_by_hand(result["model"], eval_iters=2)
    evals = [ln for ln in lines if ln.startswith("validation loss at")]
    exit_lines, exit_result = _pretrain(
        ARGS + eval_flags + ["--train-iters", "4", "--exit-interval", "1"]
    )
    exit_evals = [ln for ln in exit_lines if ln.startswith("validation loss at")]
    return evals, result["valid"], result["test"], by_hand, exit_evals, sorted(exit_result)


def test_end_of_training_evaluates_validation_then_test_as_megatron():
    ((evals, valid, test, by_hand, exit_evals, exit_keys),) = run_distributed(
        _normal_and_exit_runs, 1, timeout=120
    )
    # periodic at 2, then (even so) Megatron's end-of-run validation, then the test split
    assert [ln.split(" | ")[0] for ln in evals] == [
        "validation loss at iteration 2",
        "validation loss at iteration 2 on validation set",
        "validation loss at iteration 2 on test set",
    ], evals
    assert "lm loss PPL: " in evals[2]
    assert abs(_value(evals[1]) - valid["lm loss"]) <= 1e-6 * valid["lm loss"]
    assert abs(_value(evals[2]) - test["lm loss"]) <= 1e-6 * test["lm loss"]
    assert abs(test["lm loss"] - by_hand) <= 1e-5 * by_hand, (test, by_hand)
    assert test["lm loss"] != valid["lm loss"]  # another split, other samples
    # --exit-interval 1 stopped at iteration 1 of 4: no periodic, no final evaluation
    assert exit_evals == [] and "test" not in exit_keys and "valid" not in exit_keys


def _small_corpus_runs(tmp):
    """445 documents (the issue's corpus size) under three flag sets."""
    import numpy
    import torch

    from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = f"{tmp}/small"
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    rng = numpy.random.default_rng(0)
    for _ in range(445):
        doc = rng.integers(1, 90, size=int(rng.integers(8, 24))).tolist() + [99]
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    data = ["--data-path", prefix, "--data-cache-path", f"{tmp}/cache", "--train-iters", "1"]
    data += ["--tokenizer-type", "NullTokenizer", "--eval-interval", "1000"]
    out = {}
    try:
        _pretrain(ARGS + data + ["--eval-iters", "1"])  # default --split 969,30,1
    except ValueError as err:
        out["default_split"] = str(err)
    lines, result = _pretrain(ARGS + data + ["--eval-iters", "0"])
    out["eval_iters_0"] = ([ln for ln in lines if "validation loss" in ln], sorted(result))
    lines, result = _pretrain(ARGS + data + ["--eval-iters", "1", "--split", "98,2,0"])
    out["split_98_2_0"] = ([ln.split(" | ")[0] for ln in lines if "loss at" in ln], sorted(result))
    return out


def test_small_corpus_empty_test_split(tmp_path):
    (out,) = run_distributed(_small_corpus_runs, 1, args=(str(tmp_path),), timeout=120)
    message = out["default_split"]
    assert "the test split of" in message and "has 0 of its 445 sequences" in message
    assert "split '969, 30, 1' (--split)" in message and "--split 98,2,0" in message
    lines, keys = out["eval_iters_0"]  # nothing requested from the empty split: it trains
    assert lines == [] and "test" not in keys and "valid" not in keys
    lines, keys = out["split_98_2_0"]  # no test split: validation only
    assert lines == ["validation loss at iteration 1 on validation set"], lines
    assert "valid" in keys and "test" not in keys
