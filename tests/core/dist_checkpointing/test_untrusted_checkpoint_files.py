"""A torch_dist checkpoint's files are read only as what they claim to be.

Every file a load opens (`metadata.json`, `.metadata`, `common.pt`, the `.distcp` data files, the
integrity manifest) must be a regular file within the size limit of its kind: a FIFO under the
name would block the load forever and a link to `/dev/zero` would be read until memory runs
out. Paths named inside `.metadata` stay inside the checkpoint directory, the byte ranges it
declares are checked against the data file, and a `.metadata` that is not DCP `Metadata` says
so. Each refusal is one line naming the file.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing._safe_load import restricted_pickle_load


def _save(path, fill: float) -> str:
    os.makedirs(path)
    w = torch.full((2, 3), fill)
    dc.save({"w": dc.ShardedTensor.from_rank_offsets("w", w), "note": 1}, str(path))
    return str(path)


def _load(ckpt_dir: str) -> torch.Tensor:
    empty = torch.zeros(2, 3)
    return dc.load({"w": dc.ShardedTensor.from_rank_offsets("w", empty)}, ckpt_dir)["w"]


def _within(seconds: float, fn, fifo: str | None = None):
    """fn() in a thread; fails (and unblocks a reader of `fifo`) if it is still running."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if fifo is not None:  # a writer that closes at once: the blocked reader sees EOF
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail(f"still blocked after {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _rewrite_metadata(ckpt_dir: str, change) -> None:
    path = os.path.join(ckpt_dir, ".metadata")
    with open(path, "rb") as f:
        md = restricted_pickle_load(f, what=path)
    md.storage_data = {k: change(v) for k, v in md.storage_data.items()}
    with open(path, "wb") as f:
        pickle.dump(md, f)


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_data_file_outside_the_checkpoint_is_refused(tmp_path, how):
    a, b = _save(tmp_path / "a", 1.0), _save(tmp_path / "b", 2.0)
    name = next(n for n in os.listdir(b) if n.endswith(".distcp"))
    if how == "symlink":
        os.remove(os.path.join(a, name))
        os.symlink(os.path.join(b, name), os.path.join(a, name))
    else:
        escape = os.path.join(b, name) if how == "absolute" else f"../b/{name}"
        _rewrite_metadata(a, lambda info: dataclasses.replace(info, relative_path=escape))
    with pytest.raises(dc.CheckpointingException) as err:
        _load(a)
    msg = _one_line(err)
    assert "outside" in msg or "absolute" in msg, msg
    assert name in msg


def test_byte_range_is_checked_before_reading(tmp_path):
    a = _save(tmp_path / "a", 1.0)
    _rewrite_metadata(a, lambda info: dataclasses.replace(info, offset=-8))
    with pytest.raises(dc.CheckpointingException, match=r"offset -8 .*>= 0") as err:
        _load(a)
    assert ".metadata" in _one_line(err)


@pytest.mark.parametrize("value", [{"w": 1}, [1, 2], None], ids=["dict", "list", "none"])
def test_metadata_that_is_not_dcp_metadata_is_named(tmp_path, value):
    a = _save(tmp_path / "a", 1.0)
    with open(os.path.join(a, ".metadata"), "wb") as f:
        pickle.dump(value, f)
    with pytest.raises(dc.CheckpointingException, match="not torch.distributed.checkpoint") as e:
        _load(a)
    assert os.path.join(a, ".metadata") in _one_line(e)


@pytest.mark.parametrize("name", [".metadata", "common.pt", "metadata.json", "__0_0.distcp"])
def test_fifo_under_a_checkpoint_file_name_is_refused(tmp_path, name):
    a = _save(tmp_path / "a", 1.0)
    path = os.path.join(a, name)
    os.remove(path)
    os.mkfifo(path)

    def load():
        _load(a)
        return dc.load_common_state_dict(a)

    with pytest.raises(dc.CheckpointingException) as err:
        _within(20, load, fifo=path)
    msg = _one_line(err)
    assert "FIFO" in msg and name in msg, msg


@pytest.mark.parametrize("name", [".metadata", "common.pt", "metadata.json", "__0_0.distcp"])
def test_link_to_a_device_is_refused(tmp_path, name):
    a = _save(tmp_path / "a", 1.0)
    path = os.path.join(a, name)
    os.remove(path)
    os.symlink("/dev/zero", path)

    def load():
        _load(a)
        return dc.load_common_state_dict(a)

    with pytest.raises(
        dc.CheckpointingException, match="character device|dev/zero, outside"
    ) as err:
        _within(20, load)
    assert name in _one_line(err)


def test_integrity_manifest_names_stay_inside_the_checkpoint(tmp_path):
    import json

    a = str(tmp_path / "a")
    os.makedirs(a)
    w = torch.ones(2, 3)
    dc.save({"w": dc.ShardedTensor.from_rank_offsets("w", w)}, a, verify_integrity=True)
    manifest = os.path.join(a, "integrity_sha256.json")
    (tmp_path / "secret").write_text("x")
    with open(manifest) as f:
        data = json.load(f)
    data["files"]["../secret"] = "0" * 64
    with open(manifest, "w") as f:
        json.dump(data, f)
    with pytest.raises(dc.CheckpointingException, match="outside") as err:
        dc.load({"w": dc.ShardedTensor.from_rank_offsets("w", torch.zeros(2, 3))}, a,
                verify_integrity=True)  # fmt: skip
    assert "../secret" in _one_line(err)
