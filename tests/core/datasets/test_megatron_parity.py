"""Side by side with megatron-core (skipped without it): index builders and GPT/blended samples."""

import os
import sys

import numpy
import pytest
import torch

from gigatron.core.datasets import helpers
from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from gigatron.training.tokenizer import _NullTokenizer
from tests._paths import FIXTURES

try:
    from megatron.core.datasets import helpers as mcore_helpers
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder as McoreBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset as McoreGPTDataset
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as McoreConfig
except Exception:
    mcore_helpers = None
pytestmark = pytest.mark.skipif(mcore_helpers is None, reason="megatron-core not installed")

sys.path.insert(0, os.path.join(FIXTURES, "data"))
import make_gpt_fixture as fx  # noqa: E402


def test_build_sample_idx_matches_cpp():
    rng = numpy.random.default_rng(0)
    checked = 0
    for trial in range(400):
        n = int(rng.integers(1, 40)) if trial % 25 else int(rng.integers(70_000, 140_000))
        sizes = rng.integers(0 if trial % 3 == 0 else 1, 40, size=n).astype(numpy.int32)
        epochs = int(rng.integers(1, 4))
        doc_idx = numpy.tile(numpy.arange(n, dtype=numpy.int32), epochs)
        rng.shuffle(doc_idx)
        seq_len, tokens = int(rng.integers(2, 60)), int(sizes.sum())
        for drop in (True, False):
            for extra in (True, False):
                args = (sizes, doc_idx, seq_len, epochs, tokens, drop, extra)
                try:
                    want = mcore_helpers.build_sample_idx(*args)
                except AssertionError:  # megatron's own range check (C++ read past the end)
                    continue
                got = helpers.build_sample_idx(*args)
                assert got.dtype == want.dtype
                numpy.testing.assert_array_equal(got, want, err_msg=str((trial, drop, extra)))
                checked += 1
    assert checked > 1000


def _blend_pair(size, module, *args):
    out = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
    module(*out, *args)
    return out


@pytest.mark.parametrize("weights", [[0.3, 0.7], [1.0, 1.0], [1e-5, 1.0], [2.0, 7.0], [0.61, 0.39]])
def test_two_way_blending_matches_cpp_on_large_sizes(weights):
    w = numpy.array(weights) / sum(weights)
    size = 300_000  # several blocks of the vectorised two-dataset path
    got = _blend_pair(size, helpers.build_blending_indices, w, 2, size, False)
    want = _blend_pair(size, mcore_helpers.build_blending_indices, w, 2, size, False)
    for a, b in zip(got, want):
        numpy.testing.assert_array_equal(a, b)
    counts = numpy.array([int(1 + 9000 * weights[0] / sum(weights)), 4000], dtype=numpy.int64)
    total = int(counts.sum())
    got = _blend_pair(total, helpers.build_exhaustive_blending_indices, counts, 2)
    want = _blend_pair(total, mcore_helpers.build_exhaustive_blending_indices, counts, 2)
    for a, b in zip(got, want):
        numpy.testing.assert_array_equal(a, b)


def test_blending_indices_match_cpp():
    rng = numpy.random.default_rng(1)
    for trial in range(30):
        k = int(rng.integers(1, 6)) if trial % 10 else 20  # 20: the NumPy-per-step path
        weights = rng.random(k) + 0.01
        weights = weights / weights.sum()
        size = int(rng.integers(1, 3000))
        got = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        want = (numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64))
        helpers.build_blending_indices(*got, weights, k, size, False)
        mcore_helpers.build_blending_indices(*want, weights, k, size, False)
        numpy.testing.assert_array_equal(got[0], want[0])
        numpy.testing.assert_array_equal(got[1], want[1])

        counts = rng.integers(1, 300, size=k).astype(numpy.int64)
        total = int(counts.sum())
        got = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
        want = (numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64))
        helpers.build_exhaustive_blending_indices(*got, counts, k)
        mcore_helpers.build_exhaustive_blending_indices(*want, counts, k)
        numpy.testing.assert_array_equal(got[0], want[0])
        numpy.testing.assert_array_equal(got[1], want[1])


@pytest.fixture
def one_rank_group(tmp_path):
    # megatron-core's BlendedDataset asks torch.distributed for the rank when caching.
    if torch.distributed.is_initialized():
        yield
        return
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


VARIANTS = [
    (
        "no_extra_token",
        [0.4, 0.6],
        "85,10,5",
        [150, 30, 12],
        {"add_extra_token_to_sequence": False},
    ),
    (
        "keep_partial_valid",
        [0.6, 0.4],
        "60,35,5",
        [120, 40, 5],
        {"drop_last_partial_validation_sequence": False, "create_attention_mask": False},
    ),
    ("blend_weighted", [0.3, 0.7], "90,6,4", [200, 40, 25], {}),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gpt_blend_matches_megatron(variant, tmp_path, monkeypatch, one_rank_group):
    name, weights, split, sizes, extra = variant
    monkeypatch.chdir(tmp_path)
    prefixes = fx.write_corpora("data", IndexedDatasetBuilder)
    results = []
    for tag, builder_cls, dataset_cls, config_cls in (
        ("g", BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig),
        ("m", McoreBuilder, McoreGPTDataset, McoreConfig),
    ):
        cfg = config_cls(
            tokenizer=_NullTokenizer(fx.VOCAB),
            **fx.config_kwargs(prefixes, weights, split, extra, f"cache_{tag}"),
        )
        results.append(builder_cls(dataset_cls, sizes, lambda: True, cfg).build())
    assert sorted(os.listdir("cache_g")) == sorted(os.listdir("cache_m"))
    for ours, theirs in zip(*results):
        assert len(ours) == len(theirs)
        numpy.testing.assert_array_equal(ours.dataset_index, theirs.dataset_index)
        for a, b in zip(ours.datasets, theirs.datasets):
            for attr in ("document_index", "sample_index", "shuffle_index"):
                numpy.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
        for i in range(len(ours)):
            x, y = ours[i], theirs[i]
            assert x.keys() == y.keys()
            for key in x:
                torch.testing.assert_close(torch.as_tensor(x[key]), torch.as_tensor(y[key]))
