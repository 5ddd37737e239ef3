"""gigatron's GPT / blended datasets reproduce megatron-core's samples from a committed fixture.

The fixture (tests/fixtures/data/gpt_blend_megatron.npz) was written by
tests/fixtures/data/make_gpt_fixture.py running megatron-core 0.16.1 on the same tiny corpora:
train / valid / test of a two-corpus blend with a split string, every sample, plus the md5-named
cache files. No megatron-core needed here.
"""

import os
import sys

import numpy
import pytest

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from gigatron.training.tokenizer import _NullTokenizer
from tests._paths import FIXTURES

FIXTURE_DIR = os.path.join(FIXTURES, "data")
sys.path.insert(0, FIXTURE_DIR)
import make_gpt_fixture as fx  # noqa: E402

FIXTURE = numpy.load(os.path.join(FIXTURE_DIR, "gpt_blend_megatron.npz"))


@pytest.mark.parametrize("case", fx.CASES, ids=[c[0] for c in fx.CASES])
def test_samples_match_megatron_fixture(case, tmp_path, monkeypatch):
    name, weights, split, sizes, extra = case
    monkeypatch.chdir(tmp_path)  # relative prefixes: same md5 cache names as the fixture run
    prefixes = fx.write_corpora("data", IndexedDatasetBuilder)
    cache = os.path.join("cache", name)
    cfg = GPTDatasetConfig(
        tokenizer=_NullTokenizer(fx.VOCAB),
        **fx.config_kwargs(prefixes, weights, split, extra, cache),
    )
    built = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()
    for split_name, dataset in zip(("train", "valid", "test"), built):
        ours = fx.dump_split(dataset)
        theirs = {
            k.split("/")[-1]: FIXTURE[k]
            for k in FIXTURE.files
            if k.startswith(f"{name}/{split_name}/")
        }
        assert sorted(ours) == sorted(theirs), (split_name, sorted(ours), sorted(theirs))
        for key in theirs:
            numpy.testing.assert_array_equal(ours[key], theirs[key], err_msg=f"{split_name}/{key}")
    assert sorted(os.listdir(cache)) == FIXTURE[f"{name}/cache_files"].tolist()
