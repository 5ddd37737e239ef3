"""The tokenizer each entry point defaults to, as Megatron's scripts do (`args_defaults`):
BertWordPieceLowerCase for pretrain_bert / pretrain_t5, GPT2BPETokenizer for pretrain_gpt, taken
when the flags name a --vocab-file but no --tokenizer-type (BERT's example recipe). Without a
vocabulary file gigatron keeps NullTokenizer for --vocab-size; with neither, a one-line error
before any process group (it was an AttributeError on `padded_vocab_size` later)."""

from __future__ import annotations

import importlib

import pytest

from gigatron.training import initialize
from gigatron.training.arguments import parse_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2"]  # fmt: skip
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]


def _vocab(tmp_path) -> str:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "entry, kind",
    [
        ("pretrain_bert", "BertWordPieceLowerCase"),
        ("pretrain_t5", "BertWordPieceLowerCase"),
        ("pretrain_gpt", "GPT2BPETokenizer"),
    ],
)
def test_each_entry_point_passes_megatrons_default(monkeypatch, entry, kind):
    module = importlib.import_module(f"gigatron.training.{entry}")
    seen = {}

    def fake_pretrain(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(module, "pretrain", fake_pretrain)
    with pytest.raises(SystemExit):
        module.main(["--num-layers", "2"])
    assert seen["args_defaults"] == {"tokenizer_type": kind}


def test_vocab_file_without_type_builds_bert_wordpiece(tmp_path):
    argv = [*BASE, "--vocab-file", _vocab(tmp_path)]
    args = parse_args(argv=argv, args_defaults={"tokenizer_type": "BertWordPieceLowerCase"})
    assert args.tokenizer_type == "BertWordPieceLowerCase"
    args.vocab_size, args.tensor_model_parallel_size = None, 1
    args.make_vocab_size_divisible_by, args.load = 128, None
    initialize._build_tokenizer(args)
    assert args.padded_vocab_size == 128  # 8 words + [BOS] + [EOS], padded


def test_vocab_size_without_file_keeps_null_tokenizer():
    argv = [*BASE, "--vocab-size", "100"]
    args = parse_args(argv=argv, args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    assert args.tokenizer_type is None  # NullTokenizer at build time, as before


def test_an_explicit_type_wins(tmp_path):
    argv = [*BASE, "--vocab-file", _vocab(tmp_path), "--tokenizer-type", "BertWordPieceCase"]
    args = parse_args(argv=argv, args_defaults={"tokenizer_type": "BertWordPieceLowerCase"})
    assert args.tokenizer_type == "BertWordPieceCase"


def test_no_tokenizer_at_all_is_one_line_error():
    args = parse_args(argv=BASE)
    assert args.tokenizer_type is None and args.vocab_size is None
    with pytest.raises(ValueError, match="no tokenizer: pass --tokenizer-type"):
        initialize._build_tokenizer(args)
