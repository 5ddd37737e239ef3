"""`gigatron train --sft` from a Hugging Face Llama directory: the loss on the answers falls
over a few steps, and a data set of rows packing two conversations each trains exactly as the
same conversations one per row (--calculate-per-token-loss: the step's gradient is the mean
over all answer tokens, whatever the rows hold). With --lora-rank the same run trains adapters
only and --save writes an adapter-only checkpoint; at TP 2 on two gloo ranks it gives the
one-rank losses (the adapters start from the same values at every layout)."""

import numpy
import pytest

from gigatron.testing import run_distributed
from tests._one_rank import one_rank_fixtures
from tests.training._gpt_runs import reset_globals, run_pretrain_gpt
from tests.training.datasets._chat_data import conversation, make_chat_tokenizer, write_jsonl

pytestmark = pytest.mark.multirank
pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures()


def make_llama_dir(path: str, seed: int = 0) -> None:
    """A random-weight 2-layer Llama beside the chat tokenizer (its vocabulary)."""
    import torch
    import transformers

    vocab = make_chat_tokenizer(path)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=2, eos_token_id=6, pad_token_id=1,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(path)


def sft_flags(hf_dir: str, data: str, tmp: str) -> list[str]:
    return [
        "--load", hf_dir, "--finetune", "--sft", "--tokenizer-type", "SFTTokenizer",
        "--tokenizer-model", hf_dir, "--sft-tokenizer-prompt-format", "default",
        "--data-path", data, "--split", "1,0,0", "--data-cache-path", f"{tmp}/cache",
        "--seq-length", "64", "--micro-batch-size", "1", "--lr", "3e-3", "--min-lr", "3e-3",
        "--train-iters", "4", "--eval-iters", "0", "--log-interval", "100",
        "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--calculate-per-token-loss", "--seed", "3",
        "--make-vocab-size-divisible-by", "32",  # 64 rows at TP 1 and 2
    ]  # fmt: skip


def _losses(flags: list[str]) -> list[float]:
    return [h["losses"]["lm loss"] for h in run_pretrain_gpt(flags)["history"]]


def test_sft_packed_rows_train_as_unpacked_and_answer_loss_falls(tmp_path):
    tmp = str(tmp_path)
    make_llama_dir(f"{tmp}/hf")
    rng = numpy.random.default_rng(0)
    convs = [conversation(rng, turns=1 + i % 2) for i in range(16)]
    packed = write_jsonl(f"{tmp}/packed.jsonl", [convs[i] + convs[i + 1] for i in range(0, 16, 2)])
    single = write_jsonl(f"{tmp}/single.jsonl", [[m for m in c] for c in convs])
    lora = ["--lora-rank", "4", "--lora-alpha", "16", "--save", f"{tmp}/lora"]
    lora += ["--save-interval", "4"]
    runs = {}
    for name, data, gbs, extra in (
        ("packed", packed, 2, []), ("single", single, 4, []), ("lora", packed, 2, lora)
    ):  # fmt: skip
        flags = sft_flags(f"{tmp}/hf", data, tmp) + ["--global-batch-size", str(gbs), *extra]
        result = run_pretrain_gpt(flags)
        runs[name] = [h["losses"]["lm loss"] for h in result["history"]]
    reset_globals()
    tp2 = sft_flags(f"{tmp}/hf", packed, tmp) + ["--global-batch-size", "2", *lora]
    tp2 += ["--tensor-model-parallel-size", "2", "--save", f"{tmp}/lora_tp2"]
    for rank_losses in run_distributed(_losses, 2, args=(tp2,), timeout=240):
        for a, b in zip(rank_losses, runs["lora"], strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (rank_losses, runs["lora"])
    assert len(runs["packed"]) == 4
    for a, b in zip(runs["packed"], runs["single"], strict=True):
        assert abs(a - b) <= 1e-6 * abs(b), runs
    losses = runs["packed"]
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 0.3, runs
    # LoRA (B starts at zero: the base model's first loss), then only the adapters train
    lora_losses = runs["lora"]
    assert abs(lora_losses[0] - losses[0]) <= 1e-6 * losses[0], runs
    assert all(b < a for a, b in zip(lora_losses, lora_losses[1:])), runs
    from gigatron.training.peft.adapter_io import read_adapters

    state, config = read_adapters(f"{tmp}/lora/lora/iter_0000004")
    assert len(state) == 2 * 4 * 2 and config.dim == 4 and config.alpha == 16
    assert any(v.abs().max() > 0 for k, v in state.items() if "linear_out" in k)  # B trained


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mock-data", "--vocab-size", "100"], "--sft needs --tokenizer-type SFTTokenizer"),
        (["--tokenizer-type", "SFTTokenizer", "--mock-data"], "--sft needs --data-path"),
        (["--tokenizer-type", "SFTTokenizer", "--data-path", "d.jsonl", "--reset-position-ids"],
         "--reset-position-ids must be off"),
        (["--tokenizer-type", "SFTTokenizer", "--data-path", "d.jsonl", "--lora-rank", "0"],
         "--lora-rank \\(0\\) must be >= 1"),
        (["--tokenizer-type", "SFTTokenizer", "--data-path", "d.jsonl", "--lora-rank", "4",
          "--load", "base"], "pass --finetune"),
    ],
)  # fmt: skip
def test_sft_and_lora_flag_mistakes_are_one_line_errors(extra, message):
    from gigatron.training.arguments import parse_args, validate_args

    base = [
        "--num-layers",
        "2",
        "--hidden-size",
        "32",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "16",
        "--micro-batch-size",
        "1",
        "--train-iters",
        "2",
        "--lr",
        "1e-3",
    ]
    with pytest.raises(ValueError, match=message):
        validate_args(parse_args(argv=base + ["--sft"] + extra), 1)  # fmt: skip
