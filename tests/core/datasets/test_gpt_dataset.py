"""GPTDataset / BlendedDataset behaviour: masks, epochs, mock data, config and corpus errors."""

import numpy
import pytest
import torch

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import (
    GPTDataset,
    GPTDatasetConfig,
    MockGPTDataset,
    _get_ltor_masks_and_position_ids,
)
from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from gigatron.core.datasets.utils import get_blend_from_list
from gigatron.training.tokenizer import _NullTokenizer

EOD = 50


def _corpus(prefix, docs):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for doc in docs:
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    return prefix


def _config(**kwargs):
    base = dict(
        random_seed=3,
        sequence_length=8,
        tokenizer=_NullTokenizer(EOD),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    base.update(kwargs)
    return GPTDatasetConfig(**base)


def test_masks_with_document_resets():
    tokens = torch.tensor([1, 2, EOD, 3, 4, EOD, 5, 6])
    mask, loss, pos = _get_ltor_masks_and_position_ids(tokens, EOD, True, True, True, True)
    assert pos.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert loss.tolist() == [1, 1, 0, 1, 1, 0, 1, 1]
    allowed = ~mask[0]
    assert allowed[4].tolist() == [False, False, False, True, True, False, False, False]
    assert allowed[2].tolist() == [True, True, True, False, False, False, False, False]
    causal, loss, pos = _get_ltor_masks_and_position_ids(tokens, EOD, False, False, False, True)
    assert torch.equal(causal[0], torch.ones(8, 8, dtype=torch.bool).triu(1))
    assert pos.tolist() == list(range(8)) and loss.sum() == 8


def test_samples_overlap_by_one_token_and_cover_all_tokens(tmp_path):
    docs = [list(range(1, 11)) + [EOD], list(range(11, 30)) + [EOD]]
    prefix = _corpus(str(tmp_path / "c"), docs)
    cfg = _config(blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [None] * 3, lambda: True, cfg
    ).build()
    assert valid is None and test is None
    assert len(train) == (31 - 1) // 8
    s = train[0]
    assert set(s) == {"tokens", "labels", "attention_mask", "loss_mask", "position_ids"}
    assert s["tokens"].shape == (8,) and s["attention_mask"].shape == (1, 8, 8)
    assert torch.equal(s["labels"][:-1], s["tokens"][1:])
    # In unshuffled order, sample i + 1 starts at the last label of sample i, and the samples
    # walk the documents in document_index order.
    inverse = numpy.argsort(numpy.asarray(train.shuffle_index))
    rows = [train._query_document_sample_shuffle_indices(j) for j in inverse]
    assert all(len(r) == 9 for r in rows)
    assert all(rows[i][-1] == rows[i + 1][0] for i in range(len(rows) - 1))
    stream = numpy.concatenate([docs[d] for d in train.document_index])
    walked = numpy.concatenate([r[:-1] for r in rows] + [rows[-1][-1:]])
    numpy.testing.assert_array_equal(walked, stream[: len(walked)])
    padding = train[None]
    assert padding["loss_mask"].sum() == 0


def test_requested_size_over_several_epochs(tmp_path):
    prefix = _corpus(str(tmp_path / "c"), [[1, 2, 3, EOD]] * 5)
    cfg = _config(blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    (train, _, _) = BlendedMegatronDatasetBuilder(
        GPTDataset, [30, None, None], lambda: True, cfg
    ).build()
    assert len(train) >= 30
    assert train.document_index.shape[0] % 5 == 0 and train.document_index.shape[0] > 5


def test_mock_dataset_without_blend():
    cfg = _config(sequence_length=1024)
    assert cfg.mock and cfg.split == "1,1,1"
    train, valid, test = BlendedMegatronDatasetBuilder(
        MockGPTDataset, [20, 5, 5], lambda: True, cfg
    ).build()
    assert len(train) >= 20 and len(valid) >= 5
    sample = train[3]
    assert sample["tokens"].max() <= EOD and sample["tokens"].dtype == torch.int64


def test_errors(tmp_path):
    empty = _corpus(str(tmp_path / "empty"), [])
    cfg = _config(blend=([empty], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="empty corpus.*empty"):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, None, None], lambda: True, cfg).build()
    with pytest.raises(ValueError, match="non-negative"):
        _config(blend=(["a", "b"], [1.0, -1.0]), split="1,0,0")
    with pytest.raises(ValueError, match="positive"):
        _config(blend=(["a", "b"], [0.0, 0.0]), split="1,0,0")
    with pytest.raises(ValueError, match="equal in number"):
        _config(blend=(["a", "b"], [1.0]), split="1,0,0")
    with pytest.raises(ValueError, match="split must be provided"):
        _config(blend=(["a"], None))
    with pytest.raises(ValueError, match="reset_position_ids"):
        GPTDatasetConfig(random_seed=1, sequence_length=4, tokenizer=_NullTokenizer(5))
    with pytest.raises(FileNotFoundError, match="missing"):
        cfg = _config(blend=([str(tmp_path / "missing")], None), split="1,0,0")
        BlendedMegatronDatasetBuilder(GPTDataset, [1, None, None], lambda: True, cfg).build()


def test_get_blend_from_list():
    assert get_blend_from_list(["30", "a", "70", "b"]) == (["a", "b"], [30.0, 70.0])
    assert get_blend_from_list(["a", "b"]) == (["a", "b"], None)
    assert get_blend_from_list(["a"]) == (["a"], None)


def test_pickles_and_loads_through_dataloader_workers(tmp_path):
    import pickle

    docs = [list(range(1, 40)) + [EOD]] * 3 + [list(range(5, 25)) + [EOD]] * 4
    prefix = _corpus(str(tmp_path / "c"), docs)
    cfg = _config(blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    (train, _, _) = BlendedMegatronDatasetBuilder(
        GPTDataset, [20, None, None], lambda: True, cfg
    ).build()
    clone = pickle.loads(pickle.dumps(train))
    assert torch.equal(clone[3]["tokens"], train[3]["tokens"])
    loader = torch.utils.data.DataLoader(train, batch_size=4, num_workers=2)
    batch = next(iter(loader))
    assert batch["tokens"].shape == (4, 8) and batch["attention_mask"].shape == (4, 1, 8, 8)
    assert torch.equal(batch["labels"][2], train[2]["labels"])


def test_inter_document_masking_gives_the_reset_mask_as_bounds(tmp_path):
    """inter_document_masking's cu_seqlens / position_ids say what reset_attention_mask's
    block-diagonal mask / reset_position_ids say (documents end with EOD): for every sample."""
    docs = [list(range(1, 4)) + [EOD], list(range(4, 16)) + [EOD], [17, EOD], [18, 19, EOD]]
    prefix = _corpus(str(tmp_path / "c"), docs)
    common = dict(blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    build = lambda **kw: BlendedMegatronDatasetBuilder(  # noqa: E731
        GPTDataset, [None] * 3, lambda: True, _config(**common, **kw)
    ).build()[0]
    packed = build(inter_document_masking=True, create_attention_mask=False)
    masked = build(reset_attention_mask=True, reset_position_ids=True)
    for i in range(len(packed)):
        p, m = packed[i], masked[i]
        assert set(p) == {
            "tokens",
            "labels",
            "loss_mask",
            "position_ids",
            "cu_seqlens",
            "max_seqlen",
        }
        cu = p["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu.shape == (9,) and cu[-1] == 8
        bounds = cu[: int((cu < 8).sum()) + 1].tolist()  # drop the trailing fill
        doc = torch.repeat_interleave(torch.arange(len(bounds) - 1), torch.tensor(bounds).diff())
        allowed = (doc[:, None] == doc[None, :]) & torch.ones(8, 8, dtype=torch.bool).tril()
        assert torch.equal(~allowed, m["attention_mask"][0]), (i, bounds)
        assert torch.equal(p["position_ids"], m["position_ids"]), i
        assert p["max_seqlen"] == max(torch.tensor(bounds).diff())


@pytest.mark.parametrize("weight", [float("inf"), float("nan")])
def test_non_finite_blend_weight_is_refused(weight):
    with pytest.raises(ValueError, match=r"blend: blend weights .* must be finite"):
        _config(blend=(["a", "b"], [weight, 1.0]), split="1,0,0")


def test_config_lists_every_missing_field_at_once():
    with pytest.raises(ValueError) as err:
        GPTDatasetConfig(random_seed=1, sequence_length=0)
    text = str(err.value)
    assert len(text.splitlines()) == 1
    for name in ("sequence_length", "tokenizer", "reset_position_ids", "reset_attention_mask",
                 "eod_mask_loss"):  # fmt: skip
        assert name in text, (name, text)


def test_token_id_outside_the_vocabulary_names_the_data_path(tmp_path):
    prefix = _corpus(str(tmp_path / "corpus"), [[1, 70, 3, 4, 5, 6], [7, 70, 9, 10, 11, 12]])
    cfg = _config(blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path / "cache"))
    (train, _, _) = BlendedMegatronDatasetBuilder(
        GPTDataset, [None, None, None], lambda: True, cfg
    ).build()
    with pytest.raises(ValueError, match=r"token id 70 .*corpus.* outside the tokenizer's voc"):
        for i in range(len(train)):
            train[i]
