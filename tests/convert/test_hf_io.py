"""Streaming safetensors I/O and one-process HF <-> gigatron round trips (sharded input and
output, CLI direction detection, padded vocabulary rows, errors)."""

import json
import os

import pytest
import torch

from gigatron.convert.hf_io import HFReader, iter_planned, write_safetensors

transformers = pytest.importorskip("transformers")


def test_streaming_writer_shards_and_reads_back_bitwise(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(7, 5, generator=g),
        "b": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int64),
        "d": torch.randn(9, generator=g).half(),
    }
    plan = [(k, tuple(v.shape), v.dtype) for k, v in tensors.items()]
    files = write_safetensors(str(tmp_path), plan, iter_planned(plan, tensors.__getitem__),
                              max_shard_bytes=64)  # fmt: skip
    assert len(files) > 1 and os.path.exists(tmp_path / "model.safetensors.index.json")
    reader = HFReader(str(tmp_path))
    for name, t in tensors.items():
        assert reader.get(name).dtype == t.dtype and torch.equal(reader.get(name), t)
    for f in files:  # the reference library reads our files too
        for name, t in safetensors.load_file(str(tmp_path / f)).items():
            assert torch.equal(t, tensors[name])


def test_sharded_hf_model_round_trip_and_padding(tmp_path):
    from gigatron.cli import main as cli
    from gigatron.core.dist_checkpointing import load_plain_tensors
    from tests.convert.test_hf_fixtures import make_hf_model

    hf_dir, conv, back = tmp_path / "hf", tmp_path / "conv", tmp_path / "back"
    make_hf_model("qwen2", str(hf_dir), max_shard_size="20KB")  # several shards + index
    assert cli(["convert", "--load", str(hf_dir), "--save", str(conv)]) == 0  # auto: import
    assert (conv / "latest_checkpointed_iteration.txt").read_text() == "release"
    plain = load_plain_tensors(str(conv / "release"))
    emb = plain["embedding.word_embeddings.weight"]
    assert emb.shape[0] == 128 and torch.count_nonzero(emb[100:]) == 0  # zero padded rows
    assert (
        cli(["convert", "--load", str(conv), "--save", str(back), "--max-shard-size", "10KB"]) == 0
    )
    assert json.loads((back / "config.json").read_text()) == json.loads(
        (hf_dir / "config.json").read_text()
    )
    a, b = HFReader(str(hf_dir)), HFReader(str(back))
    assert len(set(json.loads((back / "model.safetensors.index.json").read_text())["weight_map"]
                   .values())) > 1  # fmt: skip
    assert sorted(a.keys()) == sorted(b.keys())
    for name in a.keys():
        assert torch.equal(a.get(name).view(torch.uint8), b.get(name).view(torch.uint8)), name


def test_pickle_checkpoints_are_refused(tmp_path):
    from gigatron.convert import convert_hf_to_gigatron
    from tests.convert.test_hf_fixtures import hf_config

    hf_config("llama").save_pretrained(str(tmp_path))
    torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only safetensors"):
        convert_hf_to_gigatron(str(tmp_path), str(tmp_path / "out"))


@pytest.mark.parametrize(
    "damage", ["truncated_data", "truncated_header", "empty", "huge_header_len", "bad_offsets",
               "not_json", "shape_mismatch"],
)  # fmt: skip
def test_damaged_safetensors_are_named_before_any_tensor_is_mapped(tmp_path, damage):
    import struct

    tensors = {"a": torch.arange(12.0).view(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)}
    plan = [(k, tuple(v.shape), v.dtype) for k, v in tensors.items()]
    write_safetensors(str(tmp_path), plan, iter_planned(plan, tensors.__getitem__))
    path = tmp_path / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    if damage == "truncated_data":
        raw = raw[:-4]
    elif damage == "truncated_header":
        raw = raw[: 8 + n // 2]
    elif damage == "empty":
        raw = b""
    elif damage == "huge_header_len":
        raw = struct.pack("<Q", 1 << 62) + raw[8:]
    elif damage == "not_json":
        raw = raw[:8] + b"\xff" * n + raw[8 + n :]
    else:
        key = "data_offsets" if damage == "bad_offsets" else "shape"
        header["a"][key] = [0, 10**9] if key == "data_offsets" else [4, 4]
        text = json.dumps(header).encode().ljust(n)
        raw = struct.pack("<Q", len(text)) + text + raw[8 + n :]
    path.write_bytes(raw)
    with pytest.raises(ValueError, match="model.safetensors") as err:
        HFReader(str(tmp_path))
    assert "damaged" in str(err.value) or "malformed" in str(err.value)


def test_safetensors_header_over_100_mb_is_refused_unread(tmp_path):
    import struct

    from gigatron.convert.hf_io import _read_header

    path = tmp_path / "model.safetensors"
    with open(path, "wb") as f:  # a sparse file: the header length fits in it, nothing is read
        f.write(struct.pack("<Q", 200_000_000))
        f.truncate(200_000_100)
    with pytest.raises(ValueError, match="over the 100000000-byte limit") as err:
        _read_header(str(path))
    assert "\n" not in str(err.value)
