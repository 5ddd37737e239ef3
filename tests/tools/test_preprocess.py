"""`gigatron preprocess` / `gigatron merge`: outputs, partitions, errors."""

import json
import os

import numpy
import pytest

from gigatron.cli import main as cli_main
from gigatron.cli import run as cli_run
from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.tools.train_tokenizer import train_bpe_tokenizer
from gigatron.training.tokenizer import _GPT2BPETokenizer

WORDS = "the cat sat on a mat while dogs ran far away under blue skies".split()


def _docs(n=40):
    rng = numpy.random.RandomState(0)
    return [" ".join(rng.choice(WORDS, size=rng.randint(1, 30))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("pre")
    docs = _docs()
    path = root / "corpus.jsonl"
    lines = [json.dumps({"text": d, "title": d[:5]}) for d in docs]
    lines.insert(7, "")  # blank lines are skipped
    path.write_text("\n".join(lines) + "\n")
    tok_dir = str(root / "tok")
    train_bpe_tokenizer(docs, vocab_size=300, output_dir=tok_dir, min_frequency=1)
    vocab, merges = os.path.join(tok_dir, "vocab.json"), os.path.join(tok_dir, "merges.txt")
    return root, path, docs, vocab, merges


def _gpt2_flags(vocab, merges):
    return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]


def test_preprocess_jsonl_two_keys_with_workers(corpus):
    root, path, docs, vocab, merges = corpus
    prefix = str(root / "out")
    argv = ["preprocess", "--input", str(path), "--output-prefix", prefix, "--json-keys", "text"]
    argv += ["title", "--append-eod", "--workers", "2", "--log-interval", "10"]
    assert cli_main(argv + _gpt2_flags(vocab, merges)) == 0
    tok = _GPT2BPETokenizer(vocab, merges)
    ds = IndexedDataset(prefix + "_text_document")
    assert ds.index.dtype == numpy.uint16
    assert len(ds) == len(docs)
    for i, doc in enumerate(docs):
        assert ds[i].tolist() == tok.tokenize(doc) + [tok.eod]
    titles = IndexedDataset(prefix + "_title_document")
    assert titles[3].tolist() == tok.tokenize(docs[3][:5]) + [tok.eod]


def test_partitions_give_the_same_bytes_and_merge(corpus):
    root, path, docs, vocab, merges = corpus
    outs = []
    for parts in ("1", "2"):
        prefix = str(root / f"p{parts}")
        argv = ["--input", str(path), "--output-prefix", prefix, "--partitions", parts]
        argv += ["--workers", "2", "--append-eod"]
        cli_main(["preprocess"] + argv + _gpt2_flags(vocab, merges))
        outs.append(
            tuple(open(prefix + "_text_document" + e, "rb").read() for e in (".bin", ".idx"))
        )
    assert outs[0] == outs[1]
    assert not [f for f in os.listdir(root) if "_part" in f]

    merged = str(root / "merged")
    a, b = str(root / "p1_text_document"), str(root / "p2_text_document")
    assert cli_main(["merge", "--input", a, b, "--output-prefix", merged]) == 0
    ds = IndexedDataset(merged)
    assert len(ds) == 2 * len(docs)
    assert ds[len(docs)].tolist() == ds[0].tolist()
    assert ds.document_indices.tolist() == list(range(2 * len(docs) + 1))


def test_plain_text_input_and_null_tokenizer_range_error(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1 2 3\n4 5\n6 7 99 8\n")
    prefix = str(tmp_path / "t")
    flags = ["--tokenizer-type", "NullTokenizer", "--output-prefix", prefix, "--log-interval", "0"]
    with pytest.raises(ValueError, match=r"line 3 .* token id 99 at position 2"):
        cli_run(["preprocess", "--input", str(path), "--vocab-size", "50"] + flags)
    assert cli_main(["preprocess", "--input", str(path), "--vocab-size", "100"] + flags) == 0
    ds = IndexedDataset(prefix + "_text_document")
    assert [s.tolist() for s in ds[0:3]] == [[1, 2, 3], [4, 5], [6, 7, 99, 8]]


def test_split_sentences_needs_nltk(tmp_path):
    try:
        import nltk  # noqa: F401
    except ImportError:
        path = tmp_path / "c.jsonl"
        path.write_text('{"text": "A. B."}\n')
        argv = ["preprocess", "--input", str(path), "--output-prefix", str(tmp_path / "o")]
        argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--split-sentences"]
        with pytest.raises(ValueError, match="pip install nltk"):
            cli_run(argv)
    else:
        pytest.skip("nltk is installed")


def test_sentence_splitter_never_loads_nltk_pickles(monkeypatch):
    """--split-sentences reads NLTK's punkt_tab (plain text) through PunktTokenizer; the pickled
    punkt models (`nltk.load(...pickle)`, which can run code) are never loaded."""
    import argparse
    import sys
    import types

    from gigatron.tools.preprocess_data import _sentence_splitter

    calls = []
    fake = types.ModuleType("nltk")
    fake.__version__ = "3.9.1"
    fake.load = lambda *a, **k: calls.append(("load", a)) or pytest.fail("nltk.load called")

    class PunktTokenizer:
        def __init__(self, lang):
            calls.append(("punkt_tab", lang))

    fake.tokenize = types.SimpleNamespace(PunktTokenizer=PunktTokenizer)
    monkeypatch.setitem(sys.modules, "nltk", fake)
    assert isinstance(_sentence_splitter(argparse.Namespace(lang="english")), PunktTokenizer)
    assert calls == [("punkt_tab", "english")]
    fake.tokenize = types.SimpleNamespace()  # an NLTK that only has the pickled models
    with pytest.raises(ValueError, match="3.8.2"):
        _sentence_splitter(argparse.Namespace(lang="english"))
    assert all(c[0] != "load" for c in calls)


@pytest.mark.parametrize(
    "raw, pattern",
    [
        (b'{"text": "1 2"}\n{"text": "caf\xe9"}\n', r"c\.jsonl: line 2 is not valid UTF-8 .*0xe9"),
        (b'{"text": "1 2"}\n{"text": 5}\n', r"c\.jsonl: line 2: key 'text' holds int"),
        (b'{"text": "1 2"}\n[1, 2]\n', r"c\.jsonl: line 2 is a JSON array; each line must be"),
        (b'{"text": "a \\ud800 b"}\n', r"c\.jsonl: line 1: key 'text' holds a lone surrogate"),
        (b'{"text": ["a", 3]}\n', r"c\.jsonl: line 1: key 'text' holds int"),
    ],
    ids=["bad-utf8", "non-string", "array-line", "lone-surrogate", "list-with-int"],
)
def test_bad_input_lines_are_one_line_errors_naming_file_and_line(tmp_path, capsys, raw, pattern):
    path = tmp_path / "c.jsonl"
    path.write_bytes(raw)
    argv = ["preprocess", "--input", str(path), "--output-prefix", str(tmp_path / "o")]
    argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--log-interval", "0"]
    with pytest.raises(ValueError, match=pattern):
        cli_run(argv)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_split_sentences_without_nltk_is_one_line(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "nltk", None)  # import nltk raises ImportError
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "A. B."}\n')
    argv = ["preprocess", "--input", str(path), "--output-prefix", str(tmp_path / "o")]
    argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--split-sentences"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "pip install nltk" in err and "python -m nltk.downloader punkt_tab" in err
