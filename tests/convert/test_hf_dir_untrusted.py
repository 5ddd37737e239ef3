"""A Hugging Face directory is untrusted input: the index names files inside it only, the index
and config.json are checked (regular files, JSON, their shape), and config.json's sizes must
match the tensors in the safetensors headers before anything is built from them."""

import json
import os
import shutil
import time

import pytest

from gigatron.convert import convert_hf_to_gigatron
from gigatron.convert.hf_io import INDEX_FNAME, HFReader
from gigatron.training.checkpoint_args import hf_dir_args

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    from tests.convert.test_hf_fixtures import make_hf_model

    path = tmp_path_factory.mktemp("hf") / "llama"
    make_hf_model("llama", str(path), max_shard_size="20KB")
    return path


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    from tests.convert.test_hf_fixtures import make_hf_model

    path = tmp_path_factory.mktemp("hf") / "mixtral"
    make_hf_model("mixtral", str(path))
    return path


def _copy(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_index_naming_a_file_outside_the_directory_is_refused(sharded, tmp_path, how):
    hf = _copy(sharded, tmp_path)
    index = json.loads((hf / INDEX_FNAME).read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(hf / shard, outside / "model.safetensors")
    name = {
        "dotdot": "../outside/model.safetensors",
        "absolute": str(outside / "model.safetensors"),
        "symlink": "link.safetensors",
    }[how]
    if how == "symlink":
        os.symlink(outside / "model.safetensors", hf / "link.safetensors")
    index["weight_map"] = {k: name if v == shard else v for k, v in index["weight_map"].items()}
    (hf / INDEX_FNAME).write_text(json.dumps(index))
    with pytest.raises(ValueError) as err:
        HFReader(str(hf))
    message = _one_line(err)
    assert INDEX_FNAME in message and repr(name) in message, message
    assert ("absolute" if how == "absolute" else "outside") in message, message


@pytest.mark.parametrize(
    "text, rule",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON object"),
        ('{"metadata": {}}', "no weight_map"),
        ('{"weight_map": ["a"]}', "weight_map must map"),
        ('{"weight_map": {"a": 3}}', "weight_map must map"),
        ('{"weight_map": {}}', "names no tensors"),
    ],
)
def test_malformed_index_is_one_line_naming_the_file(sharded, tmp_path, text, rule):
    hf = _copy(sharded, tmp_path)
    (hf / INDEX_FNAME).write_text(text)
    with pytest.raises(ValueError) as err:
        HFReader(str(hf))
    message = _one_line(err)
    assert str(hf / INDEX_FNAME) in message and rule in message, message


def test_index_that_is_not_a_regular_file_is_refused(sharded, tmp_path):
    hf = _copy(sharded, tmp_path)
    os.remove(hf / INDEX_FNAME)
    os.mkfifo(hf / INDEX_FNAME)
    with pytest.raises(ValueError, match="is a FIFO; only a regular file is read"):
        HFReader(str(hf))


@pytest.mark.parametrize(
    "data, rule",
    [(b'{"model_type": "llama", \xff}', "not valid UTF-8"), (b"{oops", "not JSON"),
     (b"[1]", "a JSON object")],
)  # fmt: skip
def test_bad_config_json_is_one_line_naming_the_file(sharded, tmp_path, data, rule):
    hf = _copy(sharded, tmp_path)
    (hf / "config.json").write_bytes(data)
    for read in (hf_dir_args, lambda d: convert_hf_to_gigatron(d, str(tmp_path / "out"))):
        with pytest.raises(ValueError) as err:
            read(str(hf))
        message = _one_line(err)
        assert str(hf / "config.json") in message and rule in message, message


@pytest.mark.parametrize(
    "field, value, found",
    [
        ("num_hidden_layers", 100_000_000, "2 layers"),
        ("num_hidden_layers", 3, "2 layers"),
        ("hidden_size", 1 << 20, "[100, 32]"),
        ("vocab_size", 1 << 30, "[100, 32]"),
        ("intermediate_size", 1 << 24, "[32, 48]"),
        ("num_attention_heads", 1 << 20, "[32, 32]"),
    ],
)
def test_config_sizes_are_checked_against_the_weights_before_building(
    sharded, tmp_path, field, value, found
):
    hf = _copy(sharded, tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    cfg[field] = value
    if field == "num_attention_heads":
        cfg["head_dim"] = 8
    (hf / "config.json").write_text(json.dumps(cfg))
    start = time.perf_counter()
    for read in (hf_dir_args, lambda d: convert_hf_to_gigatron(d, str(tmp_path / "out"))):
        with pytest.raises(ValueError) as err:
            read(str(hf))
        message = _one_line(err)
        assert f"config.json: {field} ({value})" in message and found in message, message
    assert time.perf_counter() - start < 20


def test_expert_count_is_checked_against_the_weights(mixtral, tmp_path):
    hf = _copy(mixtral, tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["num_local_experts"] = 1_000_000
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        hf_dir_args(str(hf))
    message = _one_line(err)
    assert "config.json: num_local_experts (1000000)" in message and "4 experts" in message


@pytest.mark.parametrize("how", ["symlink_outside", "fifo"])
def test_side_file_outside_the_directory_or_not_regular_is_refused(tmp_path, how):
    # (a FIFO, not a link to /dev/zero: a copy that ignores the rule must fail, not fill the disk)
    from gigatron.convert.hf_to_gigatron import copy_side_files

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "tokenizer_config.json").write_text("{}")
    if how == "fifo":
        os.mkfifo(src / "tokenizer.json")
    else:
        (tmp_path / "secret").write_text("password")
        os.symlink(tmp_path / "secret", src / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json") as err:
        copy_side_files(str(src), str(out))
    _one_line(err)
    assert not (out / "tokenizer.json").exists()


def test_side_files_are_copied_byte_for_byte(tmp_path):
    from gigatron.convert.hf_to_gigatron import copy_side_files

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "merges.txt").write_bytes(b"a b\n\xc3\xa9 c\n")
    assert copy_side_files(str(src), str(out)) == ["config.json", "merges.txt"]
    assert (out / "merges.txt").read_bytes() == b"a b\n\xc3\xa9 c\n"
    assert (out / "config.json").read_text() == '{"a": 1}'
