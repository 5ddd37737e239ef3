"""pretrain_t5.main on a tiny generated corpus: the span-corruption loss falls. The default suite
runs 30 steps; the slow test runs 300."""

import pytest

from gigatron.testing import run_distributed


def _args(tmp, iters):
    import os

    import torch.distributed as dist

    from tests.fixtures.bert_t5.corpus import write_corpus, write_hf_tokenizer

    prefix = f"{tmp}/tiny_text_sentence"
    if dist.get_rank() == 0:  # one writer; the other ranks wait for the files
        os.makedirs(tmp, exist_ok=True)
        write_corpus(prefix, num_documents=120)
        write_hf_tokenizer(f"{tmp}/tok")
    dist.barrier()
    return [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--encoder-seq-length", "32", "--decoder-seq-length", "16",
        "--max-position-embeddings", "32",
        "--micro-batch-size", "16", "--global-batch-size", "16",
        "--lr", "1e-2", "--min-lr", "1e-3", "--lr-decay-style", "cosine",
        "--train-iters", str(iters), "--seed", "3",
        "--data-path", prefix, "--split", "90,5,5", "--data-cache-path", f"{tmp}/cache",
        "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", f"{tmp}/tok",
        "--make-vocab-size-divisible-by", "8",
        "--log-interval", "1000", "--eval-interval", "100000", "--eval-iters", "1",
        "--no-progress-bar", "--num-workers", "0",
        "--hidden-dropout", "0", "--attention-dropout", "0",
    ]  # fmt: skip


def _train(tmp, iters):
    import torch

    from gigatron.training import pretrain_t5

    torch.set_num_threads(1)
    result = pretrain_t5.main(_args(tmp, iters))
    return [h["losses"]["lm loss"] for h in result["history"]]


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
    import torch

    from gigatron.training import pretrain_t5

    torch.set_num_threads(1)
    result = pretrain_t5.main(_args(tmp, 3) + extra)
    return [h["losses"].get("lm loss") for h in result["history"]]


def test_t5_tp2_training_matches_one_rank(tmp_path):
    """Same flags on 1 rank and on TP=2: the losses of 3 steps agree."""
    (reference,) = run_distributed(_losses, 1, args=(str(tmp_path / "a"), []), timeout=300)
    layout = run_distributed(
        _losses, 2, args=(str(tmp_path / "b"), ["--tensor-model-parallel-size", "2"]), timeout=300
    )
    for losses in layout:
        assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5, (losses, reference)
