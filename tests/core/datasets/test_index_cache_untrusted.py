"""The dataset index cache (`--data-cache-path`) is untrusted: a planted pickle never runs, and a
cache file that is not a plain integer array is rebuilt with a warning naming the file."""

from __future__ import annotations

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


class _Payload:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _corpus(prefix, seed):
    if os.path.exists(prefix + ".idx"):  # written once: a rewritten corpus gets fresh indices
        return prefix
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(12):
        doc = list(rng.integers(1, EOD, size=int(rng.integers(3, 15)))) + [EOD]
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    return prefix


def _build(tmp_path, *, blend: bool):
    prefixes = [_corpus(str(tmp_path / f"c{i}"), i) for i in range(2 if blend else 1)]
    cfg = GPTDatasetConfig(
        random_seed=3, sequence_length=8, tokenizer=_NullTokenizer(EOD),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        blend=(prefixes, [0.5, 0.5] if blend else None), split="1,0,0",
        path_to_cache=str(tmp_path / "cache"),
    )  # fmt: skip
    (train, _, _) = BlendedMegatronDatasetBuilder(GPTDataset, [20, 0, 0], lambda: True, cfg).build()
    return train


def _samples(ds):
    return numpy.stack([ds[i]["tokens"].numpy() for i in range(len(ds))])


def _cache_files(tmp_path):
    return sorted(str(p) for p in (tmp_path / "cache").glob("*.npy"))


@pytest.mark.parametrize("blend", [False, True], ids=["single", "blend"])
def test_pickled_cache_files_never_run_and_are_rebuilt(tmp_path, caplog, blend):
    fresh = _samples(_build(tmp_path, blend=blend))
    files = _cache_files(tmp_path)
    assert files and all(numpy.load(f, allow_pickle=False).dtype.kind in "iu" for f in files)
    marker = tmp_path / "pwned"
    for path in files:  # every cached index replaced by a pickled object array
        numpy.save(
            path, numpy.array([_Payload(f"touch {marker}")], dtype=object), allow_pickle=True
        )
    with caplog.at_level(logging.WARNING):
        again = _samples(_build(tmp_path, blend=blend))
    assert not marker.exists()
    numpy.testing.assert_array_equal(again, fresh)
    warned = caplog.text
    assert any(os.path.basename(p) in warned for p in files) and "stale" in warned
    # the rebuilt cache holds plain integers again and loads without a warning
    assert all(numpy.load(f, allow_pickle=False).dtype.kind in "iu" for f in files)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        numpy.testing.assert_array_equal(_samples(_build(tmp_path, blend=blend)), fresh)
    assert "stale" not in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "float", "wrong_rank", "description"])
def test_damaged_cache_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
    fresh = _samples(_build(tmp_path, blend=False))
    sample_index = next(f for f in _cache_files(tmp_path) if f.endswith("sample_index.npy"))
    if damage == "truncated":
        raw = open(sample_index, "rb").read()
        open(sample_index, "wb").write(raw[: len(raw) // 2])
    elif damage == "float":
        numpy.save(sample_index, numpy.load(sample_index).astype(numpy.float64))
    elif damage == "wrong_rank":
        numpy.save(sample_index, numpy.load(sample_index).reshape(-1))
    else:
        desc = sample_index.replace("sample_index.npy", "description.txt")
        open(desc, "w").write("{}")
    with caplog.at_level(logging.WARNING):
        numpy.testing.assert_array_equal(_samples(_build(tmp_path, blend=False)), fresh)
    assert "stale" in caplog.text
