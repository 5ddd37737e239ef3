"""One job per save directory: while a job holds `<save>/.gigatron-save.lock`, another job's save
(or `gigatron convert` into it) is refused in one line naming the holder, before anything is
written; the holder's checkpoints stay intact; a lock left by a killed job does not block."""

import os
import signal
import subprocess
import sys

import pytest

from gigatron.core.dist_checkpointing import CheckpointingException
from gigatron.core.dist_checkpointing import checkpoint_files as commit
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt
from tests._paths import REPO
from tests.training.test_checkpointing import _args, _setup

TRACKER = commit.TRACKER_FNAME

pytestmark = pytest.mark.multirank

# Another job: saves iteration 1 into argv[1], says so, then keeps running until killed.
_HOLDER = """
import argparse, sys, torch
from gigatron.training.checkpointing import save_checkpoint
model = torch.nn.Linear(4, 4)
save_checkpoint(1, model, None, None, args=argparse.Namespace(save=sys.argv[1]))
print("saved", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path):
    """A running job that holds `tmp_path/ckpt` and saved its iteration 1 there."""
    root = str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, root],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "saved"
        yield root, proc
    finally:
        proc.kill()
        proc.wait()
        commit.unlock_save_dir(root)


def _holder_intact(root):
    names = sorted(os.listdir(root))
    assert names == [commit.LOCK_FNAME, "iter_0000001", TRACKER], names
    assert commit.read_tracker(root) == (1, False)


def test_a_second_job_is_refused_naming_the_holder_and_a_dead_holders_lock_does_not_block(
    holder,
):
    root, proc = holder
    model, opt, sched = _setup()
    with pytest.raises(CheckpointingException) as err:
        ckpt.save_checkpoint(2, model, opt, sched, args=_args(root))
    line = str(err.value)
    assert "\n" not in line and "in use by another job" in line, line
    assert f"pid {proc.pid}" in line and root in line, line
    _holder_intact(root)
    proc.send_signal(signal.SIGKILL)  # no clean exit: the kernel drops its lock
    proc.wait()
    ckpt.save_checkpoint(2, model, opt, sched, args=_args(root))
    assert commit.read_tracker(root) == (2, False)
    assert "iter_0000001" in os.listdir(root)


def _save_into(root):
    model, opt, sched = _setup()
    try:
        ckpt.save_checkpoint(2, model, opt, sched, args=_args(root))
    except CheckpointingException as e:
        return str(e)
    return None


def test_the_refusal_reaches_every_rank_as_the_same_line(holder):
    root, proc = holder
    errors = run_distributed(_save_into, 2, args=(root,))
    assert errors[0] is not None and errors[0] == errors[1], errors
    assert f"pid {proc.pid}" in errors[0] and "rank 0" not in errors[0], errors[0]
    _holder_intact(root)


def test_convert_into_a_held_save_dir_is_refused(holder, tmp_path):
    pytest.importorskip("transformers")
    from gigatron.convert import convert_hf_to_gigatron
    from tests.convert.test_hf_fixtures import make_hf_model

    root, proc = holder
    make_hf_model("llama", str(tmp_path / "hf"))
    with pytest.raises(CheckpointingException, match=f"pid {proc.pid}"):
        convert_hf_to_gigatron(str(tmp_path / "hf"), root)
    _holder_intact(root)


def _pretrain_into(root):
    from tests.training._gpt_runs import ARGS, run_pretrain_gpt

    argv = ARGS + ["--train-iters", "2", "--save", root, "--save-interval", "1"]
    try:
        run_pretrain_gpt(argv)
    except CheckpointingException as e:
        return str(e)
    return None


def test_pretrain_is_refused_before_training(holder):
    root, proc = holder
    (error,) = run_distributed(_pretrain_into, 1, args=(root,))
    assert error is not None and f"pid {proc.pid}" in error, error
    _holder_intact(root)


def test_one_job_saves_again_and_a_released_dir_is_free(tmp_path):
    root = str(tmp_path)
    model, opt, sched = _setup()
    ckpt.save_checkpoint(1, model, opt, sched, args=_args(root))
    ckpt.save_checkpoint(2, model, opt, sched, args=_args(root))  # the holder itself
    text = (tmp_path / commit.LOCK_FNAME).read_text()
    assert f"pid {os.getpid()}" in text, text
    commit.unlock_save_dir(root)
