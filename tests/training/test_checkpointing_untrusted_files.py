"""A training checkpoint's tracker and metadata.json are read as the small files they are, and a
damaged checkpoint's error names the older complete one the user can load instead.

The tracker (`latest_checkpointed_iteration.txt`) and `iter_N/metadata.json` must be regular
files within their size limits: a link to `/dev/zero` would be read until memory runs out, a
FIFO would block the load forever. Each refusal is one line naming the file.
"""

from __future__ import annotations

import argparse
import os
import threading

import pytest
import torch

from gigatron.core.dist_checkpointing import CheckpointingException
from gigatron.training import checkpointing as ckpt


def _save(root, iteration: int) -> str:
    model = torch.nn.Linear(4, 4)
    args = argparse.Namespace(save=str(root), load=str(root))
    ckpt.save_checkpoint(iteration, model, None, None, args=args)
    return os.path.join(root, f"iter_{iteration:07d}")


def _load(root, **kw):
    model = torch.nn.Linear(4, 4)
    args = argparse.Namespace(load=str(root), no_load_optim=True, no_load_rng=True, **kw)
    return ckpt.load_checkpoint(model, None, None, args=args)


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
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail(f"still blocked after {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _replace(path: str, how: str) -> None:
    os.remove(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev_zero":
        os.symlink("/dev/zero", path)
    else:  # a regular file far over the limit of its kind
        with open(path, "w") as f:
            f.write(" " * (20 << 20) + "{}")


@pytest.mark.parametrize("how", ["fifo", "dev_zero", "oversized"])
@pytest.mark.parametrize("name", ["latest_checkpointed_iteration.txt", "metadata.json"])
def test_tracker_and_config_are_read_as_small_regular_files(tmp_path, name, how):
    if name == "latest_checkpointed_iteration.txt" and how == "oversized":
        how = "tracker_oversized"
    root = tmp_path / "ckpt"
    d = _save(root, 5)
    path = os.path.join(root if name.startswith("latest") else d, name)
    if how == "tracker_oversized":
        os.remove(path)
        with open(path, "w") as f:
            f.write("5" + " " * 4096)
    else:
        _replace(path, how)
    with pytest.raises(CheckpointingException) as err:
        _within(20, lambda: _load(root), fifo=path if how == "fifo" else None)
    msg = str(err.value)
    assert "\n" not in msg and name in msg, msg
    assert {"fifo": "FIFO", "dev_zero": "character device"}.get(how, "limit") in msg, msg


def test_damaged_checkpoint_names_the_older_complete_one(tmp_path):
    root = tmp_path / "ckpt"
    _save(root, 100)
    newest = _save(root, 200)
    with open(os.path.join(newest, "common.pt"), "r+b") as f:
        f.truncate(10)
    with pytest.raises(CheckpointingException) as err:
        _load(root)
    msg = str(err.value)
    assert "\n" not in msg and "iter_0000200" in msg and "damaged" in msg, msg
    assert "iter_0000100 is complete: pass --ckpt-step 100 (or write 100 into" in msg, msg
    assert "latest_checkpointed_iteration.txt" in msg, msg
    assert _load(root, ckpt_step=100)[0] == 100  # what the message says to do, either way
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")
    assert _load(root)[0] == 100


def test_ckpt_step_loads_that_iteration_and_names_itself_when_missing(tmp_path, capsys):
    root = tmp_path / "ckpt"
    _save(root, 100)
    _save(root, 200)
    assert _load(root, ckpt_step=100)[0] == 100
    assert "--ckpt-step 100: loading iteration 100" in capsys.readouterr().out
    with pytest.raises(CheckpointingException) as err:
        _load(root, ckpt_step=150)
    msg = str(err.value)
    assert "\n" not in msg and "--ckpt-step 150 names" in msg and "iter_0000150" in msg, msg
    assert "iter_0000100 is complete: pass --ckpt-step 100" in msg, msg


@pytest.mark.parametrize("dirname", ["ckpt", "outside-runs", "damaged-disk"])
def test_user_errors_get_no_older_checkpoint_advice(tmp_path, dirname):
    """Damage is told by the error's type, not by words in it (a path may hold any word)."""
    root = tmp_path / dirname
    _save(root, 100)
    _save(root, 200)
    model = torch.nn.Linear(4, 4)
    args = argparse.Namespace(load=str(root), no_load_rng=True)  # optimizer state was not saved
    with pytest.raises(CheckpointingException, match="--no-load-optim") as err:
        ckpt.load_checkpoint(model, torch.optim.SGD(model.parameters(), lr=0.1), None, args=args)
    assert "is complete" not in str(err.value)


def test_one_load_unpickles_the_dcp_metadata_once(tmp_path, monkeypatch):
    """`.metadata` goes through a pure-Python unpickler (slow on a large model): one load reads
    it once, and a rewritten `.metadata` is read afresh."""
    from gigatron.core.dist_checkpointing import remove_sharded_tensors
    from gigatron.core.dist_checkpointing.strategies import _torch_load

    reads = []
    real = _torch_load.restricted_pickle_load

    def counting(f, *, what):
        reads.append(what)
        return real(f, what=what)

    monkeypatch.setattr(_torch_load, "restricted_pickle_load", counting)
    d = _save(tmp_path / "ckpt", 5)
    assert _load(tmp_path / "ckpt")[0] == 5
    assert len(reads) == 1 and reads[0].startswith("DCP metadata"), reads
    remove_sharded_tensors(d, "bias")
    keys = _torch_load.read_dcp_metadata(d).state_dict_metadata
    assert "weight" in keys and "bias" not in keys
