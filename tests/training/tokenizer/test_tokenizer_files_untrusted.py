"""Tokenizer files are untrusted input: regular files within a size limit, and bad UTF-8, bad
JSON or a malformed line is one line naming the file (never a library's bare message)."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from gigatron.tools.train_tokenizer import main as train_main
from gigatron.tools.train_tokenizer import train_bpe_tokenizer
from gigatron.training.tokenizer import build_tokenizer
from gigatron.training.tokenizer._tiktoken import load_mergeable_ranks

pytest.importorskip("tokenizers")
TEXTS = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen jugs"] * 5


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(TEXTS, vocab_size=300, output_dir=str(directory), min_frequency=1)
    return directory


def _gpt2(d):
    return SimpleNamespace(tokenizer_type="GPT2BPETokenizer", vocab_file=str(d / "vocab.json"),
                           merge_file=str(d / "merges.txt"))  # fmt: skip


def _hf(d):
    return SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(d))


def _bert(d):
    return SimpleNamespace(tokenizer_type="BertWordPieceLowerCase", vocab_file=str(d / "vocab.txt"))


def _refused(args, name: str, rule: str) -> str:
    with pytest.raises(ValueError) as err:
        build_tokenizer(args)
    message = str(err.value)
    assert "\n" not in message and name in message and rule in message, message
    return message


@pytest.mark.parametrize(
    "name, make",
    [("vocab.json", _gpt2), ("merges.txt", _gpt2), ("tokenizer.json", _hf),
     ("tokenizer_config.json", _hf), ("vocab.txt", _bert)],
)  # fmt: skip
def test_bad_utf8_names_the_file(tok_dir, tmp_path, name, make):
    d = tmp_path / "tok"
    shutil.copytree(tok_dir, d)
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    (d / name).write_bytes((d / name).read_bytes()[:20] + b"\xff\xfe" + b"x" * 10)
    _refused(make(d), str(d / name), "not valid UTF-8")


@pytest.mark.parametrize(
    "name, text, make, rule",
    [("vocab.json", "{oops", _gpt2, "not JSON"), ("vocab.json", "[1, 2]", _gpt2, "object"),
     ("merges.txt", "#version: 0.2\na b c\n", _gpt2, "line 2"),
     ("tokenizer.json", "{oops", _hf, "not a tokenizer.json"),
     ("tokenizer_config.json", "[1]", _hf, "object")],
)  # fmt: skip
def test_malformed_files_name_the_file_and_rule(tok_dir, tmp_path, name, text, make, rule):
    d = tmp_path / "tok"
    shutil.copytree(tok_dir, d)
    (d / name).write_text(text)
    _refused(make(d), str(d / name), rule)


def test_tokenizer_file_that_is_not_a_regular_file_is_refused(tok_dir, tmp_path):
    d = tmp_path / "tok"
    shutil.copytree(tok_dir, d)
    os.remove(d / "tokenizer.json")
    os.mkfifo(d / "tokenizer.json")
    _refused(_hf(d), str(d / "tokenizer.json"), "is a FIFO")


def test_tiktoken_vocabulary_bad_utf8_names_the_file(tmp_path):
    path = tmp_path / "tok.json"
    path.write_bytes(b'[{"rank": 0, "token_bytes": "\xff"}]')
    with pytest.raises(ValueError, match=r"tok\.json is not valid UTF-8"):
        load_mergeable_ranks(str(path))


def test_train_tokenizer_says_when_the_corpus_gives_fewer_tokens(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "tok"
    assert train_main(["--input", str(corpus), "--vocab-size", "32000",
                       "--output-dir", str(out)]) == 0  # fmt: skip
    reached = len(json.loads((out / "vocab.json").read_text()))
    lines = [line for line in capsys.readouterr().out.splitlines() if "32000" in line]
    assert reached < 32000 and len(lines) == 1, lines
    assert f"{reached} tokens" in lines[0] and "merges" in lines[0], lines[0]


def test_train_tokenizer_bad_utf8_corpus_names_file_and_line(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"fine line\nbad \xff line\n")
    with pytest.raises(ValueError, match=r"c\.txt:2: not valid UTF-8"):
        train_main(["--input", str(corpus), "--vocab-size", "300",
                    "--output-dir", str(tmp_path / "tok")])  # fmt: skip
