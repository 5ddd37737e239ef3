"""`gigatron <command>` talks to a person (issue 30, item 4): a configuration mistake is one line
`gigatron <command>: error: ...` with exit status 2 (before: a 20-49-line traceback, or ~150
lines of usage before a typo'd flag's "did you mean"), with hints for the usual slips (a
--data-path without `_text_document`, TP 2 started without torchrun); help shows defaults, each
command has its own (`generate --help` was the whole training parser, `merge --help` stopped
mid-sentence); `gigatron --version` (was an unknown command)."""

import pytest

from gigatron import __version__
from gigatron.cli import main

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
         "--vocab-size", "100"]  # fmt: skip


def _run(argv, capsys):
    """(exit status, stdout, stderr lines) of `gigatron <argv>` in this process."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err.strip().splitlines()


def test_typo_flag_is_one_line_without_the_usage_dump(capsys):
    rc, _, err = _run(["train", *MODEL, "--mock-data", "--tensor-model-paralel-size", "2"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (
        "gigatron train: error: unknown flag --tensor-model-paralel-size; did you mean "
        "--tensor-model-parallel-size? (gigatron train --help lists the flags)"
    )


def test_bad_flag_value_is_one_line(capsys):
    rc, _, err = _run(["train", *MODEL, "--mock-data", "--lr", "fast"], capsys)
    assert rc == 2 and len(err) == 1 and "argument --lr: invalid float value: 'fast'" in err[0]


def test_configuration_error_is_one_line_without_traceback(capsys):
    """validate_args' ValueError: the line names the flags; the source path is left out."""
    rc, _, err = _run(["train", *MODEL, "--mock-data", "--fp16", "--bf16"], capsys)
    assert rc == 2 and err == ["gigatron train: error: --fp16 and --bf16 are mutually exclusive"]
    rc, _, err = _run(["train", *MODEL, "--mock-data", "--micro-batch-size", "0"], capsys)
    assert err == ["gigatron train: error: --micro-batch-size (0) must be >= 1"], err


def test_debug_lets_the_exception_through(capsys, monkeypatch):
    with pytest.raises(ValueError, match="mutually exclusive"):
        main(["train", "--debug", *MODEL, "--mock-data", "--fp16", "--bf16"])
    monkeypatch.setenv("GIGATRON_DEBUG", "1")
    with pytest.raises(ValueError, match="mutually exclusive"):
        main(["train", *MODEL, "--mock-data", "--fp16", "--bf16"])


def test_data_path_without_the_text_document_suffix_is_hinted(tmp_path, capsys):
    for ext in (".bin", ".idx"):
        (tmp_path / f"corpus_text_document{ext}").write_bytes(b"")
    prefix = str(tmp_path / "corpus")
    rc, _, err = _run(["train", *MODEL, "--data-path", prefix], capsys)
    assert rc == 2 and err == [
        f"gigatron train: error: --data-path {prefix}: no {prefix}.bin / .idx, but "
        f"{prefix}_text_document.bin exists: give --data-path {prefix}_text_document "
        "(gigatron preprocess adds _text_document to --output-prefix)"
    ], err
    rc, _, err = _run(["train", *MODEL, "--data-path", "0.5", prefix + "_text_document",
                       "0.5", str(tmp_path / "other")], capsys)  # fmt: skip
    assert rc == 2 and f"{tmp_path}/other.bin does not exist" in err[0], err


def test_tensor_parallel_without_a_launcher_says_how_to_launch(capsys, monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    rc, _, err = _run(["train", *MODEL, "--mock-data", "--tensor-model-parallel-size", "2"],
                      capsys)  # fmt: skip
    assert rc == 2 and len(err) == 1, err
    assert err[0].endswith(
        "this process was not started by a launcher: run 2 processes with "
        "`torchrun --nproc-per-node 2 -m gigatron.cli train ...`"
    ), err


def test_train_help_shows_defaults_and_the_command(capsys):
    rc, out, _ = _run(["train", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: gigatron train [--flag VALUE ...]\n")
    assert "Train a GPT model with Megatron-LM's pretrain_gpt.py flags." in out
    flat = " ".join(out.split())  # help strings are the config fields' docstrings, wrapped
    assert "--seed SEED Seed of Python" in flat and "data order. (default: 1234)" in flat
    assert "Learning-rate decay after the warmup. (default: linear)" in flat
    assert "--override-opt_param-scheduler, --override-opt-param-scheduler" in out
    rc, out, _ = _run(["train-bert", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: gigatron train-bert")
    assert "Train a BERT model with Megatron-LM's pretrain_bert.py flags." in out


def test_generate_help_lists_generate_flags_only(capsys):
    rc, out, _ = _run(["generate", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: gigatron generate")
    for flag in ("--prompt", "--greedy", "--max-new-tokens", "--load", "--tokenizer-model"):
        assert flag in out, flag
    for flag in ("--lr-decay-style", "--num-layers", "--save-interval", "--data-path"):
        assert flag not in out, flag
    assert len(out.splitlines()) < 80


def test_merge_help_is_a_complete_sentence(capsys):
    rc, out, _ = _run(["merge", "--help"], capsys)
    text = " ".join(out.split())
    assert rc == 0 and "datasets into one (Megatron's `tools/merge_datasets.py`)." in text
    assert "all must share a token dtype." in text


def test_version_and_top_level_help(capsys):
    rc, out, _ = _run(["--version"], capsys)
    assert rc == 0 and out == f"gigatron {__version__}\n"
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0 and "GIGATRON_DEBUG=1" in out and "--version" in out
    rc, _, err = _run(["trian"], capsys)
    assert rc == 2 and err[0] == "gigatron: error: unknown command 'trian'; did you mean 'train'?"


def test_output_into_a_closed_pipe_ends_quietly():
    """`gigatron layout ... | head -1`: once the reader closes the pipe the command stops with
    no traceback (the 4,096-rank table is larger than a pipe's buffer, so the write must fail)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "gigatron.cli", "layout", "--world-size", "4096", "--tp", "8"]
    proc = subprocess.Popen(cmd + ["--pp", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"layout: world 4096")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
