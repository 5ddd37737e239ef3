"""The README's data commands, as a new user types them in an empty directory.

`gigatron preprocess --output-prefix data/corpus ...` (README "Using it", docs/preprocess.md) used
to fail with FileNotFoundError when `data/` did not exist yet; `gigatron merge` likewise.
"""

from __future__ import annotations

import json

import numpy

from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.tools import merge_datasets, preprocess_data
from gigatron.tools.train_tokenizer import train_bpe_tokenizer

_TEXTS = [f"story {i}: the cat sat on mat number {i} and slept." for i in range(20)]


def _corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _TEXTS))
    train_bpe_tokenizer(_TEXTS, vocab_size=300, output_dir=str(tmp_path / "tok"))
    return path


def test_readme_preprocess_then_merge_into_new_directories(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = f"--input {corpus.name} --output-prefix data/corpus --tokenizer-type "
    argv += "HuggingFaceTokenizer --tokenizer-model tok/ --append-eod --workers 1"
    assert not (tmp_path / "data").exists()
    assert preprocess_data.main(argv.split()) == 0
    ds = IndexedDataset(str(tmp_path / "data" / "corpus_text_document"))
    assert len(ds) == len(_TEXTS)
    assert all(int(ds[i][-1]) == int(ds[0][-1]) for i in range(len(ds)))  # EOD appended

    # partitions take the same path: the directory is created before they start
    argv2 = argv.replace("data/corpus", "data2/corpus") + " --partitions 2"
    assert preprocess_data.main(argv2.split()) == 0
    ds2 = IndexedDataset(str(tmp_path / "data2" / "corpus_text_document"))
    assert numpy.array_equal(ds2.index.sequence_lengths, ds.index.sequence_lengths)

    out = "merged/all"
    assert merge_datasets.main(
        ["--input", "data/corpus_text_document", "data2/corpus_text_document",
         "--output-prefix", out]
    ) == 0  # fmt: skip
    merged = IndexedDataset(str(tmp_path / out))
    assert len(merged) == 2 * len(_TEXTS)
    numpy.testing.assert_array_equal(merged[len(_TEXTS)], ds[0])
