"""`make train`'s demo: asked for by name, and a finished demo is not retrained silently."""

import pytest

from gigatron import cli
from gigatron.training import demo


def test_bare_train_names_the_flags_and_the_demo(monkeypatch, capsys):
    monkeypatch.setattr(demo, "main", lambda argv: pytest.fail("the demo started unasked"))
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--demo" in err[0] and "gigatron train --help" in err[0], err


def test_train_demo_runs_the_demo(monkeypatch):
    monkeypatch.setattr(demo, "main", lambda argv: 7)
    assert cli.main(["train", "--demo"]) == 7


def _finished_demo(tmp_path, iteration: int):
    (tmp_path / "stdlib.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    (tmp_path / "stdlib_text_document.idx").write_bytes(b"")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")


@pytest.mark.parametrize("iteration, trains", [(400, False), (200, True)])
def test_repeat_run_says_when_nothing_is_left_to_train(tmp_path, monkeypatch, capsys, iteration,
                                                       trains):  # fmt: skip
    _finished_demo(tmp_path, iteration)
    monkeypatch.setenv("DEMO_DIR", str(tmp_path))
    monkeypatch.setenv("DEMO_ITERS", "400")
    commands = []
    monkeypatch.setattr(demo, "_run", lambda cmd, env=None: commands.append(cmd))
    assert demo.main([]) == 0
    trained = any("gigatron.training.pretrain_gpt" in cmd for cmd in commands)
    assert trained == trains, commands
    assert any("generate" in cmd for cmd in commands)  # the sample still comes
    out = capsys.readouterr().out
    if not trains:
        assert "already holds iteration 400 (DEMO_ITERS=400)" in out, out
        assert "DEMO_ITERS=800 make train" in out and "make train-fresh" in out, out


def test_demo_reads_its_tracker_as_a_small_regular_file(tmp_path):
    import os
    import threading

    from gigatron.core.dist_checkpointing import CheckpointingException
    from gigatron.training.demo import trained_iterations

    assert trained_iterations(tmp_path) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12")
    assert trained_iterations(tmp_path) == 12
    os.remove(tmp_path / "latest_checkpointed_iteration.txt")
    os.mkfifo(tmp_path / "latest_checkpointed_iteration.txt")
    out = {}

    def run():
        try:
            trained_iterations(tmp_path)
        except CheckpointingException as e:
            out["error"] = str(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader, then fail
        os.close(
            os.open(tmp_path / "latest_checkpointed_iteration.txt", os.O_WRONLY | os.O_NONBLOCK)
        )
        t.join(5)
        raise AssertionError("reading a FIFO tracker blocked")
    assert "FIFO" in out.get("error", ""), out
