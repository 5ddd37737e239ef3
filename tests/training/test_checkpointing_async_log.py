"""--async-save says what happened when: `scheduled` when the save is handed to the background
writer, `published` once `maybe_finalize_async_save` has renamed it into place and moved the
tracker; never `saved` for a checkpoint that is not there yet."""

import os
import subprocess
import sys

from gigatron.training import checkpointing as ckpt
from tests._paths import REPO
from tests.training._gpt_runs import ARGS
from tests.training.test_checkpointing import _args, _setup


def test_published_is_said_only_when_the_tracker_moved(tmp_path, capsys):
    model, opt, sched = _setup()
    ckpt.save_checkpoint(5, model, opt, sched, args=_args(tmp_path, async_save=True))
    ckpt._ASYNC_QUEUE._calls[0].thread.join()  # written, not finalized
    assert "published" not in capsys.readouterr().out
    assert not (tmp_path / "latest_checkpointed_iteration.txt").exists()
    ckpt.maybe_finalize_async_save(blocking=True)
    assert capsys.readouterr().out.strip() == f"published checkpoint at iteration 5 to {tmp_path}"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "5"
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))  # synchronous: no line here
    assert "published" not in capsys.readouterr().out


def test_training_log_schedules_then_publishes(tmp_path):
    save = str(tmp_path / "ckpt")
    argv = ARGS + ["--train-iters", "2", "--save", save, "--save-interval", "1", "--async-save"]
    out = subprocess.run(
        [sys.executable, "-m", "gigatron.cli", "train", *argv],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if "checkpoint at iteration" in x]
    assert lines == [
        f"scheduled checkpoint at iteration 1 to {save} (async)",
        f"published checkpoint at iteration 1 to {save}",
        f"scheduled checkpoint at iteration 2 to {save} (async)",
        f"published checkpoint at iteration 2 to {save}",
    ], out.stdout[-3000:]
