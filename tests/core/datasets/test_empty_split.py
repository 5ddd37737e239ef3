"""An empty split under BlendedMegatronDatasetBuilder: samples requested from it stop the build
with an error naming --split (Megatron's GPTDataset loops forever there: 0 tokens per epoch);
none requested (size 0, --eval-iters 0) gives None for it; one epoch (size None) is unchanged."""

import numpy
import pytest
import torch

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from gigatron.training.tokenizer import _NullTokenizer

EOD = 99


def _corpus(prefix: str, num_docs: int) -> str:
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    rng = numpy.random.default_rng(0)
    for _ in range(num_docs):
        doc = rng.integers(1, 90, size=int(rng.integers(8, 24))).tolist() + [EOD]
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    return prefix


def _build(tmp_path, sizes, **config):
    cfg = GPTDatasetConfig(
        random_seed=1,
        sequence_length=16,
        tokenizer=_NullTokenizer(EOD),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(tmp_path / "cache"),
        **config,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()


def test_default_split_leaves_a_small_corpus_no_test_sequences(tmp_path):
    """969,30,1 over 445 sequences: test = [round(.999 * 445), round(1.0 * 445)) = [445, 445)."""
    prefix = _corpus(str(tmp_path / "c"), 445)
    with pytest.raises(ValueError) as err:
        _build(tmp_path, [8, 4, 4], blend=([prefix], None), split="969,30,1")
    message = str(err.value)
    assert f"the test split of {prefix} has 0 of its 445 sequences" in message
    assert "split '969,30,1' (--split)" in message and "--split 98,2,0" in message
    assert "but 4 samples were requested" in message and "--eval-iters 0" in message
    train, valid, test = _build(tmp_path, [8, 4, 0], blend=([prefix], None), split="969,30,1")
    assert test is None and len(train) >= 8 and len(valid) >= 4
    assert len(valid.indices) == 14  # [431, 445): the validation split keeps its sequences
    train, valid, test = _build(tmp_path, [8, 4, 4], blend=([prefix], None), split="98,2,0")
    assert test is None and valid is not None  # no test split at all: nothing built


def test_empty_valid_split_and_blends(tmp_path):
    a = _corpus(str(tmp_path / "a"), 445)
    b = _corpus(str(tmp_path / "b"), 445)
    with pytest.raises(ValueError, match=r"the valid split of .* --split 90,5,5"):
        _build(tmp_path, [8, 4, 0], blend=([a], None), split="9999,1,0")
    blend = ([a, b], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"the test split of .*has 0 of its 445 sequences"):
        _build(tmp_path, [8, 4, 4], blend=blend, split="969,30,1")
    train, valid, test = _build(tmp_path, [8, 4, 0], blend=blend, split="969,30,1")
    assert test is None and len(train) >= 8 and len(valid) >= 4
    # one epoch (size None) of an empty split: an empty dataset, as before and as Megatron
    train, valid, test = _build(tmp_path, [8, 4, None], blend=([a], None), split="969,30,1")
    assert test is not None and len(test) == 0


def test_one_epoch_of_a_weighted_blend_is_refused_as_megatron_asserts(tmp_path):
    """A split of size None (one epoch) with blend weights has no defined mix: refused with an
    error that is both ValueError (gigatron's callers) and AssertionError (Megatron's tests)."""
    prefix = _corpus(str(tmp_path / "a"), 20)
    with pytest.raises(ValueError, match="size is None") as err:
        _build(tmp_path, [None, None, None], blend=([prefix, prefix], [0.5, 0.5]), split="100,0,0")
    assert isinstance(err.value, AssertionError)
