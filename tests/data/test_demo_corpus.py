"""The embedded demo corpus tokenizes into a GPT dataset that trains-ready samples come from."""

import os

import pytest

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from gigatron.core.datasets.indexed_dataset import IndexedDataset
from gigatron.data import demo_corpus_path, prepare_demo_corpus
from gigatron.training.tokenizer import build_tokenizer


def test_demo_corpus_round_trip(tmp_path):
    pytest.importorskip("tokenizers")
    assert 200_000 <= os.path.getsize(demo_corpus_path()) <= 500_000
    demo = prepare_demo_corpus(str(tmp_path), vocab_size=512)
    again = prepare_demo_corpus(str(tmp_path), vocab_size=512)  # cached: same files, no rebuild
    assert again == demo
    ds = IndexedDataset(demo.data_prefix)
    assert len(ds) == demo.num_documents > 100
    assert int(ds.sequence_lengths.sum()) == demo.num_tokens
    args = type("Args", (), {})()
    for flag, value in zip(demo.megatron_args()[::2], demo.megatron_args()[1::2]):
        setattr(args, flag[2:].replace("-", "_"), value)
    tokenizer = build_tokenizer(args)
    first_story = open(demo_corpus_path()).readline().rstrip("\n")
    assert tokenizer.detokenize(ds[0][:-1].tolist()) == first_story
    assert ds[0][-1] == tokenizer.eod

    cfg = GPTDatasetConfig(
        random_seed=1,
        sequence_length=32,
        blend=([demo.data_prefix], None),
        split="98,2,0",
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(tmp_path / "cache"),
    )
    train, valid, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [64, 8, 0], lambda: True, cfg
    ).build()
    assert len(train) >= 64 and train[0]["tokens"].shape == (32,)
    assert int(train[5]["tokens"].max()) < tokenizer.vocab_size
