"""megatron.training.checkpointing helpers: the --freeze-all-layers resume iteration, tokenizer
files copied into a checkpoint, and which TE `_extra_state` payloads are worth saving."""

import io
import logging
from types import SimpleNamespace

import pytest
import torch

from gigatron.core.dist_checkpointing.mapping import (
    LocalNonpersistentObject,
    ShardedObject,
    ShardedTensor,
)
from gigatron.training import checkpointing as ckpt


def test_frozen_resume_iteration_reads_the_tracker(tmp_path):
    assert ckpt.read_frozen_resume_iteration(None) == 0
    assert ckpt.read_frozen_resume_iteration(str(tmp_path)) == 0
    tracker = ckpt.get_checkpoint_tracker_filename(str(tmp_path))
    with open(tracker, "w") as f:
        f.write("250\n")
    assert ckpt.read_frozen_resume_iteration(str(tmp_path)) == 250
    with open(tracker, "w") as f:
        f.write("release")
    assert ckpt.read_frozen_resume_iteration(str(tmp_path)) == 0


def test_tokenizer_files_copied_by_type(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.json").write_text("{}")
    (tmp_path / "m.txt").write_text("a b\n")
    config = SimpleNamespace(tokenizer_type="GPT2BPETokenizer", vocab_file="v.json")
    config.merge_file = str(tmp_path / "m.txt")
    ckpt.save_tokenizer_assets(object(), config, str(tmp_path / "ckpt"))
    saved = sorted(p.name for p in (tmp_path / "ckpt" / "tokenizer").iterdir())
    assert saved == ["merges.txt", "vocab.json"]


def test_tokenizer_none_or_null_or_missing_file(tmp_path, caplog):
    ckpt.save_tokenizer_assets(None, SimpleNamespace(tokenizer_type="x"), str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    ckpt.save_tokenizer_assets(
        object(), SimpleNamespace(tokenizer_type="NullTokenizer"), str(tmp_path)
    )
    assert list((tmp_path / "tokenizer").iterdir()) == []
    config = SimpleNamespace(tokenizer_type="TikTokenizer", tokenizer_model=str(tmp_path / "no"))
    with caplog.at_level(logging.DEBUG, logger=ckpt.logger.name):
        ckpt.save_tokenizer_assets(object(), config, str(tmp_path))
    assert "not found" in caplog.text


def test_tokenizer_save_pretrained_on_wrapped_tokenizer(tmp_path):
    calls = []
    inner = SimpleNamespace(save_pretrained=calls.append)
    config = SimpleNamespace(tokenizer_type="HuggingFaceTokenizer")
    ckpt.save_tokenizer_assets(SimpleNamespace(_tokenizer=inner), config, str(tmp_path))
    assert calls == [str(tmp_path / "tokenizer")]


def _te_payload(d: dict) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(d, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


@pytest.mark.parametrize(
    ("data", "persistent"),
    [
        (None, False),
        (torch.empty(0, dtype=torch.uint8), False),
        (_te_payload({"recipe": "Float8CurrentScaling"}), False),
        (_te_payload({"scale_fwd": torch.ones(1)}), True),
        ({"not": "a tensor"}, True),
    ],
)
def test_fp8_extra_state_persistence(data, persistent):
    assert ckpt._fp8_extra_state_is_persistent(data) is persistent


def test_localize_only_redundant_extra_states():
    empty = ShardedObject("a._extra_state", None, (1,), (0,))
    delayed = ShardedObject("b._extra_state", _te_payload({"amax_history_fwd": 1}), (1,), (0,))
    other = ShardedObject("c.meta", None, (1,), (0,))
    weight = ShardedTensor.from_rank_offsets("w", torch.zeros(2), replica_id=0)
    sd = {"e": empty, "d": [delayed], "o": other, "w": weight}
    ckpt._localize_redundant_extra_states(sd)
    assert isinstance(sd["e"], LocalNonpersistentObject) and sd["e"].unwrap() is None
    assert sd["d"][0] is delayed and sd["o"] is other and sd["w"] is weight
