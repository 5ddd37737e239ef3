"""Re-saving an iteration into a save root that already holds it (issue 28, item 3).

A save writes into a fresh `iter_N.tmp-<token>/`; only when every rank has finished does rank 0
move an existing `iter_N/` aside, rename the new directory in, write the tracker, and delete the
old copy. A crash at any point leaves a complete checkpoint that loads: the previous one, or the
new one once it is complete and named `iter_N/`.
"""

import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing import checkpoint_files as commit
from gigatron.core.dist_checkpointing.strategies import torch as torch_strategy
from gigatron.training import checkpointing as ckpt
from tests._paths import REPO
from tests.training.test_checkpointing import _args, _setup, _step

REPO = str(REPO)
TRACKER = "latest_checkpointed_iteration.txt"


# Where a save can die: mid-write (one .distcp at 0 bytes, as kill -9 leaves it), with every
# file complete but nothing renamed, between moving iter_N/ aside and renaming the new one in,
# after the rename but before the tracker, after the tracker but before deleting the aside copy.
POINTS = ("write", "publish", "between_renames", "tracker", "remove_aside")
NEW_VISIBLE = ("tracker", "remove_aside")  # the new iter_N/ is complete and in place


def _names(root):
    """The save root's entries, without the lock file every saving job holds there."""
    return sorted(n for n in os.listdir(root) if n != commit.LOCK_FNAME)


def _truncate_one(directory):
    data = sorted(n for n in os.listdir(directory) if n.endswith(".distcp"))
    with open(os.path.join(directory, data[0]), "wb"):
        pass


def _arm(point, crash, set_attr=setattr):
    """Make the next save call `crash()` at `point` of the protocol."""
    if point == "write":
        real_write = torch_strategy.PendingSave.write

        def write(self):
            real_write(self)
            _truncate_one(self.writer.path)
            crash()

        set_attr(torch_strategy.PendingSave, "write", write)
    elif point == "between_renames":
        real_rename, calls = commit._rename, []

        def rename(src, dst):
            calls.append(src)
            if len(calls) == 2:  # iter_N/ is aside, the new dir not yet in
                crash()
            real_rename(src, dst)

        set_attr(commit, "_rename", rename)
    else:
        owner, name = {
            "publish": (commit, "_fsync_tree"),
            "tracker": (commit, "write_tracker"),
            "remove_aside": (commit, "_remove"),
        }[point]
        set_attr(owner, name, lambda *a, **k: crash())


def _kill():
    os.kill(os.getpid(), signal.SIGKILL)


def _resave_and_die(work, point):
    """Child process: a complete, tracked `<work>/ckpt/iter_0000006`, a copy of it and of both
    weights; then a re-save of iteration 6 into the same root, SIGKILLed at `point`."""
    root = os.path.join(work, "ckpt")
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(root))
    shutil.copytree(os.path.join(root, "iter_0000006"), os.path.join(work, "before"))
    torch.save(model.w1.detach(), os.path.join(work, "w1_old.pt"))
    _step(model, opt, sched)
    torch.save(model.w1.detach(), os.path.join(work, "w1_new.pt"))
    _arm(point, _kill)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(root))


def _bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _loaded_w1(root):
    model, opt, sched = _setup(seed=11)
    it, _ = ckpt.load_checkpoint(model, opt, sched, args=_args(root))
    return it, model.w1.detach().clone()


@pytest.mark.parametrize("point", POINTS)
def test_resave_of_the_tracked_iteration_killed_at_each_point(tmp_path, point, capsys):
    """The issue's case: the tracker names 6 and a run saves 6 again into the same root; kill -9
    at any point leaves iteration 6 loadable: the old copy, or the new one once it is in place."""
    code = "import sys; from tests.training.test_checkpointing_resave import _resave_and_die as f; "
    code += "f(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), point], cwd=REPO, capture_output=True
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    root = tmp_path / "ckpt"
    assert (root / TRACKER).read_text() == "6"
    expected = torch.load(tmp_path / ("w1_new.pt" if point in NEW_VISIBLE else "w1_old.pt"))
    if point == "between_renames":
        assert not (root / "iter_0000006").exists()
        (aside,) = root.glob("iter_0000006.old-*")
        assert _bytes(aside) == _bytes(tmp_path / "before")  # moved, never modified
    elif point not in NEW_VISIBLE:
        assert _bytes(root / "iter_0000006") == _bytes(tmp_path / "before")
    capsys.readouterr()
    it, w1 = _loaded_w1(root)
    assert it == 6 and torch.equal(w1, expected)
    warned = capsys.readouterr().out
    assert ("iter_0000006.old-" in warned) == (point == "between_renames"), warned
    # The next save repairs / removes the leftovers; iteration 6 keeps what was loaded.
    model, opt, sched = _setup(seed=12)
    ckpt.save_checkpoint(8, model, opt, sched, args=_args(root))
    assert _names(root) == ["iter_0000006", "iter_0000008", TRACKER]
    assert torch.equal(dc.load_plain_tensors(str(root / "iter_0000006"))["layer.w1"], expected)


@pytest.mark.parametrize("point", ("write", "publish", "tracker"))
def test_save_of_a_new_iteration_failing_at_each_point(tmp_path, point, monkeypatch):
    """Tracker on 4, a save of 6 fails: 4 loads, until the retry of 6 publishes (in place of
    the complete but untracked iter_0000006/ a crash after its rename left)."""
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(4, model, opt, sched, args=_args(tmp_path))
    w1_at_4 = model.w1.detach().clone()
    _step(model, opt, sched)

    def crash():
        raise OSError(f"died at {point}")

    _arm(point, crash, monkeypatch.setattr)
    with pytest.raises(dc.CheckpointingException, match=f"OSError: died at {point}"):
        ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))
    monkeypatch.undo()
    assert (tmp_path / TRACKER).read_text() == "4"
    assert (tmp_path / "iter_0000006").exists() == (point == "tracker")
    it, w1 = _loaded_w1(tmp_path)
    assert it == 4 and torch.equal(w1, w1_at_4)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))
    assert _names(tmp_path) == ["iter_0000004", "iter_0000006", TRACKER]
    it, w1 = _loaded_w1(tmp_path)
    assert it == 6 and torch.equal(w1, model.w1.detach())


def test_async_resave_keeps_the_tracked_copy_until_finalize(tmp_path):
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))
    before = _bytes(tmp_path / "iter_0000006")
    _step(model, opt, sched)
    new_w1 = model.w1.detach().clone()
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path, async_save=True))
    with torch.no_grad():
        model.w1.add_(1.0)  # training goes on while the write runs
    ckpt._ASYNC_QUEUE._calls[0].thread.join()  # written, not finalized: nothing published yet
    assert _bytes(tmp_path / "iter_0000006") == before
    ckpt.maybe_finalize_async_save(blocking=True)
    assert _names(tmp_path) == ["iter_0000006", TRACKER]
    it, w1 = _loaded_w1(tmp_path)
    assert it == 6 and torch.equal(w1, new_w1)


def test_failed_async_write_publishes_nothing(tmp_path, monkeypatch):
    model, opt, sched = _setup()
    _step(model, opt, sched)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))
    before = _bytes(tmp_path / "iter_0000006")
    _step(model, opt, sched)
    _arm("write", lambda: (_ for _ in ()).throw(OSError("disk full")), monkeypatch.setattr)
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path, async_save=True))
    with pytest.raises(dc.CheckpointingException, match="OSError: disk full"):
        ckpt.maybe_finalize_async_save(blocking=True)
    monkeypatch.undo()
    assert _bytes(tmp_path / "iter_0000006") == before
    assert not list(tmp_path.glob("iter_0000006.tmp-*"))  # removed once every rank failed
    ckpt.save_checkpoint(7, model, opt, sched, args=_args(tmp_path))
    assert _names(tmp_path) == ["iter_0000006", "iter_0000007", TRACKER]


def test_load_is_read_only_and_repair_keeps_the_only_complete_copy(tmp_path, capsys):
    """Between the renames a load reads the aside copy without renaming it (the load root may
    be read-only); staging dirs and incomplete asides never shadow a complete iter_N/."""
    model, opt, sched = _setup()
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path))
    os.rename(tmp_path / "iter_0000006", tmp_path / "iter_0000006.old-ab12")
    os.mkdir(tmp_path / "iter_0000006.old-cd34")  # an incomplete aside: ignored
    os.mkdir(tmp_path / "iter_0000006.tmp-ef56")
    (tmp_path / f"{TRACKER}.tmp.4242").write_text("8")  # a tracker write killed before its rename
    assert _loaded_w1(tmp_path)[0] == 6
    assert "loading its complete copy" in capsys.readouterr().out
    assert _names(tmp_path) == [
        "iter_0000006.old-ab12", "iter_0000006.old-cd34", "iter_0000006.tmp-ef56", TRACKER,
        f"{TRACKER}.tmp.4242",
    ]  # fmt: skip
    commit.repair_leftovers(str(tmp_path))
    assert _names(tmp_path) == ["iter_0000006", TRACKER]
    assert _loaded_w1(tmp_path)[0] == 6


def test_every_reader_of_a_save_root_finds_the_aside_copy(tmp_path, capsys):
    """generate, convert and the early read of the saved args resolve the tracker the way
    load_checkpoint does: a save that died between its renames leaves only the aside copy."""
    from gigatron.convert.gigatron_to_hf import find_checkpoint_dir
    from gigatron.tools.generate import _checkpoint_args

    model, opt, sched = _setup()
    ckpt.save_checkpoint(6, model, opt, sched, args=_args(tmp_path, consumed_train_samples=64))
    final = commit.checkpoint_dir(str(tmp_path), 6)
    aside = final + commit.ASIDE_TAG + "deadbeef"
    os.rename(final, aside)
    assert commit.tracked_dir(str(tmp_path)) == aside
    assert find_checkpoint_dir(str(tmp_path)) == aside
    assert _checkpoint_args(str(tmp_path)).consumed_train_samples == 64
    assert "loading its complete copy" in capsys.readouterr().out
