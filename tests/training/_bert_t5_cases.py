"""Shared pieces of the pretrain_bert / pretrain_t5 end-to-end tests (megatron.training's
pretrain entry points): the tiny generated corpus, the flags both models train with, and the
loss history of one run. Everything here runs inside run_distributed ranks."""


def corpus_args(tmp, iters, model_flags):
    """Writes the tiny corpus and HF tokenizer under `tmp` (rank 0; the others wait) and returns
    the flags shared by the BERT and T5 runs plus `model_flags` (sequence lengths, learning
    rates): 2 layers, hidden 32, 4 heads, batch 16, `iters` steps, no dropout, no eval."""
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
        *model_flags,
        "--max-position-embeddings", "32",
        "--micro-batch-size", "16", "--global-batch-size", "16",
        "--lr-decay-style", "cosine",
        "--train-iters", str(iters), "--seed", "3",
        "--data-path", prefix, "--split", "90,5,5", "--data-cache-path", f"{tmp}/cache",
        "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", f"{tmp}/tok",
        "--make-vocab-size-divisible-by", "8",
        "--log-interval", "1000", "--eval-interval", "100000", "--eval-iters", "1",
        "--no-progress-bar", "--num-workers", "0",
        "--hidden-dropout", "0", "--attention-dropout", "0",
    ]  # fmt: skip


def train_history(entry, args):
    """Runs gigatron.training.<entry>.main(args) on one torch thread; its per-step history."""
    import importlib

    import torch

    torch.set_num_threads(1)
    return importlib.import_module(f"gigatron.training.{entry}").main(args)["history"]
