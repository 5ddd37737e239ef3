"""BlendedMegatronDatasetBuilder on 2 gloo ranks with a blend of two corpora (rank 0 builds the
mid-level datasets first, rank 1 waits at a barrier):
- an `is_built_on_rank` that is False on rank 1 (Megatron's pretrain_gpt builds only on TP rank
  0 of the first / last stage): rank 1's mid-level datasets are None, which the empty-split
  rule took for "empty, 0 requested" and skipped the BlendedDataset's barriers (a hang);
- an empty split asked for samples raises on both ranks (it raised on rank 0 only, leaving
  rank 1 at the barrier)."""

import pathlib

import pytest

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _builder_run(tmp: str, sizes, split: str, rank0_only: bool):
    import torch.distributed as dist

    from gigatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from gigatron.training.tokenizer import _NullTokenizer
    from tests.core.datasets.test_empty_split import EOD, _corpus

    p = pathlib.Path(tmp)
    a, b = str(p / "a"), str(p / "b")
    if dist.get_rank() == 0:
        _corpus(a, 445), _corpus(b, 445)
    dist.barrier()
    cfg = GPTDatasetConfig(
        random_seed=1,
        sequence_length=16,
        tokenizer=_NullTokenizer(EOD),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(p / "cache"),
        blend=([a, b], [1.0, 1.0]),
        split=split,
    )
    on_rank = (lambda: dist.get_rank() == 0) if rank0_only else (lambda: True)
    try:
        out = BlendedMegatronDatasetBuilder(GPTDataset, sizes, on_rank, cfg).build()
    except ValueError as err:
        return str(err)
    return [None if d is None else len(d) for d in out]


def test_blend_built_on_rank_zero_only(tmp_path):
    got = run_distributed(
        _builder_run, 2, args=(str(tmp_path), [8, 4, 4], "90,5,5", True), timeout=60
    )
    assert got == [[8, 4, 4], [None, None, None]]


def test_blend_with_an_empty_split_raises_on_every_rank(tmp_path):
    got = run_distributed(
        _builder_run, 2, args=(str(tmp_path), [8, 4, 4], "969,30,1", False), timeout=60
    )
    assert all("the test split of" in msg and "0 of its 445" in msg for msg in got), got
