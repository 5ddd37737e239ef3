"""A save that cannot write (disk full, quota, file too large) stops with one line naming the
save directory and the cause, on every rank; the checkpoints already published stay loadable
and the partial staging directory is removed."""

import errno
import os
import subprocess
import sys

import pytest
import torch

from gigatron.core.dist_checkpointing import CheckpointingException
from gigatron.core.dist_checkpointing import checkpoint_files as commit
from gigatron.core.dist_checkpointing.strategies import torch as torch_strategy
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt
from tests._paths import REPO
from tests.training.test_checkpointing import _args, _setup

pytestmark = pytest.mark.multirank

# Saves iteration 1, then iteration 2 with files capped at argv[2] bytes (RLIMIT_FSIZE: the
# kernel's EFBIG, which torch's zip writer reports as "unexpected pos ..."); prints the error.
_CAPPED = """
import argparse, resource, signal, sys, torch
from gigatron.training.checkpointing import save_checkpoint
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters())
model(torch.ones(1, 64)).sum().backward(); opt.step()
args = argparse.Namespace(save=sys.argv[1], consumed_train_samples=0)
save_checkpoint(1, model, opt, None, args=args)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    save_checkpoint(2, model, opt, None, args=args)
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def _published(root):
    return sorted(n for n in os.listdir(root) if n != commit.LOCK_FNAME)


def test_a_file_size_limit_hit_mid_tensor_is_one_line_naming_the_directory(tmp_path):
    root = str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", _CAPPED, root, "17000"],  # common.pt fits, a .distcp does not
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout + out.stderr
    line = lines[0]
    assert line.startswith(f"CheckpointingException: could not save iteration 2 into {root}: ")
    assert "EFBIG (File too large)" in line and "unexpected pos" not in line, line
    assert commit.read_tracker(root) == (1, False)
    assert _published(root) == ["iter_0000001", commit.TRACKER_FNAME]
    model = torch.nn.Linear(64, 64)
    assert ckpt.load_checkpoint(model, None, None, args=_args(root, no_load_optim=True)) == (1, 0)


def _torch_style_enospc(self):
    """What torch's writer raises when the disk fills mid-file: its zip writer's complaint,
    with the OSError as the context."""
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        raise RuntimeError(  # noqa: B904  (torch raises it so: the OSError is only the context)
            "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
        )


def _disk_full_on_rank1(root):
    import torch.distributed as dist

    from tests.training.test_checkpointing_resave_end_to_end import _RowSharded

    model = _RowSharded(seed=dist.get_rank())
    ckpt.save_checkpoint(1, model, None, None, args=_args(root))
    saved = model.w1.detach().clone()
    with torch.no_grad():
        model.w1.add_(1.0)
    if dist.get_rank() == 1:
        torch_strategy.PendingSave.write = _torch_style_enospc
    try:
        ckpt.save_checkpoint(2, model, None, None, args=_args(root))
        error = None
    except CheckpointingException as e:
        error = str(e)
    again = _RowSharded(seed=9)
    loaded = ckpt.load_checkpoint(again, None, None, args=_args(root, no_load_optim=True))
    return error, loaded[0], torch.equal(again.w1, saved)


def test_disk_full_on_one_rank_is_the_same_line_on_every_rank(tmp_path):
    root = str(tmp_path)
    (err0, it0, same0), (err1, it1, same1) = run_distributed(
        _disk_full_on_rank1, 2, args=(root,), timeout=90
    )
    assert err0 is not None and err0 == err1, (err0, err1)
    assert f"could not save iteration 2 into {root}: rank 1 could not write " in err0, err0
    assert "ENOSPC (No space left on device)" in err0 and "\n" not in err0, err0
    assert (it0, it1, same0, same1) == (1, 1, True, True)
    assert _published(root) == ["iter_0000001", commit.TRACKER_FNAME]  # staging removed


def test_disk_full_in_a_background_write_is_one_line_and_publishes_nothing(tmp_path, monkeypatch):
    model, opt, sched = _setup()
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(tmp_path))
    monkeypatch.setattr(torch_strategy.PendingSave, "write", _torch_style_enospc)
    ckpt.save_checkpoint(2, model, opt, sched, args=_args(tmp_path, async_save=True))
    try:
        ckpt.maybe_finalize_async_save(blocking=True)
        error = None
    except CheckpointingException as e:
        error = str(e)
    assert error is not None and "ENOSPC (No space left on device)" in error, error
    assert f"could not save iteration 2 into {tmp_path}" in error, error
    assert _published(tmp_path) == ["iter_0000001", commit.TRACKER_FNAME]
