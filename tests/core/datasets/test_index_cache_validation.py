"""Cached dataset indices are checked before use: a well-formed `.npy` whose values cannot be
this dataset's (a shuffle index that is not a permutation, ids out of range) is rebuilt with a
warning naming the file, and a corpus regenerated under the same prefix gets fresh indices (the
cache is keyed on the size and mtime of its `.idx` / `.bin`)."""

from __future__ import annotations

import glob
import logging
import os

import numpy
import pytest
import torch

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from gigatron.training.tokenizer import _NullTokenizer

EOD = 50


def _corpus(prefix, seed, docs=12):
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(docs):
        doc = list(rng.integers(1, EOD, size=int(rng.integers(3, 15)))) + [EOD]
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    return prefix


def _build(tmp_path, prefixes, cache="cache", sizes=(20, 0, 0)):
    cfg = GPTDatasetConfig(
        random_seed=3, sequence_length=8, tokenizer=_NullTokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        blend=(prefixes, [0.5] * len(prefixes) if len(prefixes) > 1 else None), split="1,0,0",
        path_to_cache=str(tmp_path / cache),
    )  # fmt: skip
    builder = BlendedMegatronDatasetBuilder(GPTDataset, list(sizes), lambda: True, cfg)
    return builder.build()[0]


def _samples(ds):
    return numpy.stack([ds[i]["tokens"].numpy() for i in range(len(ds))])


def _one(tmp_path, pattern):
    (path,) = glob.glob(str(tmp_path / "cache" / pattern))
    return path


@pytest.mark.parametrize(
    "pattern, damage",
    [
        ("*GPTDataset-train-shuffle_index.npy", lambda a: numpy.zeros_like(a)),
        ("*GPTDataset-train-shuffle_index.npy", lambda a: a[:-1]),
        ("*GPTDataset-train-sample_index.npy", lambda a: a + 10_000),
        ("*GPTDataset-train-sample_index.npy", lambda a: a[::-1].copy()),
        ("*GPTDataset-train-document_index.npy", lambda a: a + 1_000),
        ("*GPTDataset-train-document_index.npy", lambda a: a[:-1]),
    ],
    ids=[
        "shuffle-zeros",
        "shuffle-short",
        "sample-range",
        "sample-order",
        "doc-range",
        "doc-short",
    ],
)
def test_damaged_gpt_indices_are_rebuilt(tmp_path, caplog, pattern, damage):
    prefix = _corpus(str(tmp_path / "c"), 0)
    fresh = _samples(_build(tmp_path, [prefix]))
    path = _one(tmp_path, pattern)
    numpy.save(path, damage(numpy.load(path)), allow_pickle=False)
    with caplog.at_level(logging.WARNING):
        again = _samples(_build(tmp_path, [prefix]))
    numpy.testing.assert_array_equal(again, fresh)
    assert os.path.basename(path) in caplog.text and "stale" in caplog.text


@pytest.mark.parametrize("name", ["dataset_index", "dataset_sample_index"])
def test_damaged_blend_indices_are_rebuilt(tmp_path, caplog, name):
    prefixes = [_corpus(str(tmp_path / f"c{i}"), i) for i in range(2)]
    fresh = _samples(_build(tmp_path, prefixes))
    path = _one(tmp_path, f"*BlendedDataset-train-{name}.npy")
    numpy.save(path, numpy.load(path) + 7, allow_pickle=False)
    with caplog.at_level(logging.WARNING):
        again = _samples(_build(tmp_path, prefixes))
    numpy.testing.assert_array_equal(again, fresh)
    assert os.path.basename(path) in caplog.text and "stale" in caplog.text


@pytest.mark.parametrize("blend", [False, True], ids=["single", "blend"])
def test_regenerated_corpus_under_the_same_prefix_gets_fresh_indices(tmp_path, blend):
    prefixes = [str(tmp_path / f"c{i}") for i in range(2 if blend else 1)]
    for i, prefix in enumerate(prefixes):
        _corpus(prefix, i, docs=12)
    _build(tmp_path, prefixes)
    for i, prefix in enumerate(prefixes):  # new documents, other lengths, same prefix
        _corpus(prefix, 100 + i, docs=5)
    again = _samples(_build(tmp_path, prefixes))
    clean = _samples(_build(tmp_path, prefixes, cache="clean"))
    numpy.testing.assert_array_equal(again, clean)


def test_cache_file_names_stay_megatron_s(tmp_path):
    """The fingerprint lives in description.txt; the md5 in the names is Megatron's."""
    prefix = _corpus(str(tmp_path / "c"), 0)
    ds = _build(tmp_path, [prefix])
    description = open(_one(tmp_path, "*-description.txt")).read()
    assert description.startswith(ds.unique_description)
    assert os.path.basename(_one(tmp_path, "*-description.txt")).startswith(
        ds.unique_description_hash
    )


@pytest.mark.parametrize("damage", [lambda a: a + 10_000, lambda a: a[:, ::-1].copy()])
def test_damaged_masked_sample_index_is_rebuilt(tmp_path, caplog, damage):
    from gigatron.core.datasets.bert_dataset import (
        BERTMaskedWordPieceDataset,
        BERTMaskedWordPieceDatasetConfig,
    )
    from tests.fixtures.bert_t5.corpus import write_corpus

    prefix = str(tmp_path / "tiny_text_sentence")
    tok = write_corpus(prefix)
    cfg = BERTMaskedWordPieceDatasetConfig(
        random_seed=1, sequence_length=48, blend=([prefix], None), split="1,0,0",
        path_to_cache=str(tmp_path / "cache"), tokenizer=tok, masking_probability=0.15,
        short_sequence_probability=0.1, masking_max_ngram=3, masking_do_full_word=True,
        masking_do_permutation=False, masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=False, classification_head=False,
    )  # fmt: skip

    def build():
        builder = BlendedMegatronDatasetBuilder(BERTMaskedWordPieceDataset, [8, 0, 0], None, cfg)
        return builder.build()[0]

    fresh = build().sample_index.copy()
    path = _one(tmp_path, "*-sample_index.npy")
    numpy.save(path, damage(numpy.load(path)), allow_pickle=False)
    with caplog.at_level(logging.WARNING):
        numpy.testing.assert_array_equal(build().sample_index, fresh)
    assert os.path.basename(path) in caplog.text and "stale" in caplog.text


def test_a_crash_while_writing_the_cache_never_pairs_a_new_description_with_old_arrays(
    tmp_path, monkeypatch
):
    from gigatron.core.datasets import _index_cache

    prefix = _corpus(str(tmp_path / "c0"), 0, docs=12)
    _build(tmp_path, [prefix])
    _corpus(prefix, 100, docs=5)  # regenerated: the cache must be rebuilt
    real, calls = _index_cache.save_index, []

    def crash_on_second(path, array):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real(path, array)

    monkeypatch.setattr(_index_cache, "save_index", crash_on_second)
    monkeypatch.setattr(
        "gigatron.core.datasets.gpt_dataset.save_index", crash_on_second, raising=False
    )
    with pytest.raises(OSError, match="disk full"):
        _build(tmp_path, [prefix])
    monkeypatch.undo()
    (description,) = glob.glob(str(tmp_path / "cache" / "*GPTDataset-train-description.txt")) or [
        None
    ]
    after_crash = open(description).read() if description else None
    again = _samples(_build(tmp_path, [prefix]))
    fresh = open(_one(tmp_path, "*GPTDataset-train-description.txt")).read()
    assert after_crash != fresh  # the new description is written only after its arrays
    numpy.testing.assert_array_equal(again, _samples(_build(tmp_path, [prefix], cache="clean")))
