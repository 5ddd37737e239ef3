"""BlendedMegatronDatasetBuilder on 2 gloo ranks: rank 0 builds and caches, rank 1 loads."""

import os

import numpy
import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import FIXTURES

pytestmark = pytest.mark.multirank


def _build_on_ranks(directory):
    import torch.distributed as dist

    from gigatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from gigatron.training.tokenizer import _NullTokenizer

    prefixes = [os.path.join(directory, "corpus_a"), os.path.join(directory, "corpus_b")]
    cfg = GPTDatasetConfig(
        random_seed=5,
        sequence_length=16,
        blend=(prefixes, [0.5, 0.5]),
        split="90,10,0",
        path_to_cache=os.path.join(directory, "cache"),
        tokenizer=_NullTokenizer(1000),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    rank = dist.get_rank()
    # Rank 0 must find nothing cached yet: it builds, the others wait at the barrier and load.
    before = os.path.isdir(cfg.path_to_cache) and bool(os.listdir(cfg.path_to_cache))
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [64, 8, 0], lambda: True, cfg
    ).build()
    loaded_from_cache = isinstance(train.datasets[0].sample_index, numpy.memmap)
    tokens = torch.stack([train[i]["tokens"] for i in range(len(train))]).numpy()
    return rank, before, loaded_from_cache, tokens, len(valid), test


def test_rank0_builds_other_ranks_load(tmp_path):
    import sys

    sys.path.insert(0, os.path.join(FIXTURES, "data"))
    import make_gpt_fixture as fx

    from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    fx.write_corpora(str(tmp_path), IndexedDatasetBuilder)
    results = run_distributed(_build_on_ranks, 2, args=(str(tmp_path),), timeout=120)
    (r0, before0, cached0, tok0, nv0, t0), (r1, _, cached1, tok1, nv1, t1) = results
    assert (r0, r1) == (0, 1) and not before0
    assert not cached0 and cached1  # rank 0 built in memory, rank 1 memory-mapped the cache
    numpy.testing.assert_array_equal(tok0, tok1)
    assert tok0.shape == (64, 16)
    assert nv0 == nv1 >= 8 and t0 is None and t1 is None
