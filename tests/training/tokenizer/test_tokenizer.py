"""Tokenizers: Megatron's interface and ids equal to the reference implementations."""

import json
import os
from types import SimpleNamespace

import pytest

from gigatron.tools.train_tokenizer import main as train_main
from gigatron.tools.train_tokenizer import train_bpe_tokenizer
from gigatron.training.tokenizer import _NullTokenizer, build_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 42 degrees!",
    "Hello   world\n\nnew paragraph\twith tabs and ümlauts — and 日本語 text.",
    "they're we'll I'd <|endoftext|> isn't 3.14159 $$$ ... !!!",
] * 20
SAMPLES = TEXTS[:3] + [" leading space", "", "trailing   ", "a\r\nb"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tok"))
    train_bpe_tokenizer(TEXTS, vocab_size=320, output_dir=directory, min_frequency=1)
    return directory


def test_null_tokenizer_matches_megatron():
    tok = _NullTokenizer(1000)
    assert tok.vocab_size == 1001 and tok.eod == 1000 == tok.vocab_size - 1
    assert tok.tokenize("1 2 3") == [1, 2, 3] and tok.detokenize([4, 5]) == "4 5"
    assert tok.unique_identifiers == {
        "class": "_NullTokenizer",
        "tokenizer_path": [None],
        "vocab_size": "1000",
    }
    args = SimpleNamespace(
        tokenizer_type="NullTokenizer",
        vocab_size=1000,
        make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=3,
        rank=0,
    )
    assert build_tokenizer(args).eod == 1000
    assert args.padded_vocab_size == 1152  # ceil(1001 / 384) * 384


def test_gpt2_bpe_matches_reference_gpt2_tokenizer(tok_dir):
    transformers = pytest.importorskip("transformers")
    vocab, merges = os.path.join(tok_dir, "vocab.json"), os.path.join(tok_dir, "merges.txt")
    args = SimpleNamespace(tokenizer_type="GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    ours = build_tokenizer(args)
    # transformers' slow GPT2Tokenizer is OpenAI's byte-level BPE algorithm, like Megatron's.
    ref = transformers.GPT2Tokenizer(vocab, merges)
    assert ours.vocab_size == len(json.load(open(vocab)))
    assert ours.eod == ours.vocab["<|endoftext|>"]
    for text in SAMPLES:
        ids = ours.tokenize(text)
        assert ours.detokenize(ids) == text
        # transformers treats <|endoftext|> in text as special; Megatron's GPT-2 BPE (built with
        # special_tokens=[]) does not, so compare the text around it.
        for piece in text.split("<|endoftext|>"):
            assert ours.tokenize(piece) == ref.encode(piece, add_special_tokens=False), piece
    assert ours.tokenize("<|endoftext|>") != [ours.eod]
    assert args.padded_vocab_size == 384


def test_hf_tokenizer_json_matches_transformers(tok_dir):
    transformers = pytest.importorskip("transformers")
    ours = build_tokenizer(
        SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tok_dir)
    )
    ref = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(tok_dir, "tokenizer.json"), eos_token="<|endoftext|>"
    )
    for text in SAMPLES:
        assert ours.tokenize(text) == ref(text).input_ids
    assert ours.eod == ref.eos_token_id and ours.vocab_size == len(ref)
    assert ours.pad is None


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="--vocab-file"):
        build_tokenizer(SimpleNamespace(tokenizer_type="GPT2BPETokenizer", merge_file="m"))
    with pytest.raises(ValueError, match="not supported"):
        build_tokenizer(SimpleNamespace(tokenizer_type="Nope"))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        build_tokenizer(
            SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(tmp_path))
        )
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install sentencepiece"):
            build_tokenizer(
                SimpleNamespace(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="x")
            )


def test_train_tokenizer_cli(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "tok"
    assert (
        train_main(["--input", str(corpus), "--vocab-size", "300", "--output-dir", str(out)]) == 0
    )
    assert sorted(os.listdir(out)) == [
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
