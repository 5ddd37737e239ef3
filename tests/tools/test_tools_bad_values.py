"""`gigatron estimate`, `layout` and `schedule` on values that were accepted and then said
"layout ok" for a negative memory, divided by zero, or grew for minutes (huge sizes), and on
input files that are no regular files (/dev/zero never ended): each is one error line naming
the flag, the value and the rule or limit, exit status 2."""

from __future__ import annotations

import os

import pytest

from gigatron import cli
from gigatron.tools import layout, schedule

ESTIMATE = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--max-position-embeddings 64 --micro-batch-size 4 --world-size 1"
).split()


def _one_line(capsys, argv, *parts):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"gigatron {argv[0]}: error: "), err
    for part in parts:
        assert part in err, (part, err)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--vocab-size", "256", "--gpu-memory-gib", "-1"], "--gpu-memory-gib (-1.0) must be"),
        (["--vocab-size", "256", "--gpu-memory-gib", "nan"], "--gpu-memory-gib (nan) must be"),
        (["--vocab-size", "0"], "--vocab-size (0) must be >= 1"),
        (["--vocab-size", "256", "--gpus-per-node", "0"], "--gpus-per-node (0) must be >= 1"),
    ],
)
def test_estimate_refuses_values_outside_their_range(capsys, extra, message):
    _one_line(capsys, ["estimate", *ESTIMATE, *extra], message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world-size", "0"], "--world-size (0) must be >= 1"),
        (["--world-size", "-4"], "--world-size (-4) must be >= 1"),
        (["--world-size", str(10**9)], f"above gigatron layout's {layout.MAX_RANKS:,} ranks"),
        (["--world-size", "4", "--pp", "2", "--vpp", str(10**9)], "model chunks"),
        (["--world-size", "2048", "--out", "x.svg"], f"above the {layout.MAX_DRAWN_RANKS:,} drawn"),
    ],
)
def test_layout_refuses_sizes_outside_its_limits(capsys, argv, message):
    _one_line(capsys, ["layout", *argv], message)


def test_layout_leaves_the_per_rank_table_out_above_its_limit(capsys):
    assert cli.main(["layout", "--world-size", str(2 * layout.MAX_TABLE_RANKS), "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "rank  node" not in out and "(per-rank table left out: 8192 ranks" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pp", "0", "--num-microbatches", "4"], "pipeline_model_parallel_size (0) must be >= 1"),
        (["--pp", "4", "--num-microbatches", "0"], "num_microbatches (0) must be >= 1"),
        (["--pp", "4096", "--num-microbatches", "100000"], "above gigatron schedule's"),
        (["--pp", "64", "--num-microbatches", "1024", "--out", "x.svg"],
         f"above the {schedule.MAX_DRAWN:,} drawn"),
    ],
)  # fmt: skip
def test_schedule_refuses_sizes_outside_its_limits(capsys, argv, message):
    _one_line(capsys, ["schedule", *argv], message)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_device_and_fifo_inputs_are_refused_without_reading(capsys, tmp_path):
    """/dev/zero (endless) and a FIFO without a writer (blocks) as a calibration table or a
    timeline; a file that is no JSON names itself."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path, what in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        _one_line(capsys, ["schedule", "--from-timeline", path], path, what)
        _one_line(capsys, ["estimate", *ESTIMATE, "--vocab-size", "256", "--calibration", path],
                  path, what)  # fmt: skip
    _one_line(capsys, ["schedule", "--from-timeline", str(bad)], f"{bad}: not JSON")
    _one_line(capsys, ["estimate", *ESTIMATE, "--vocab-size", "256", "--calibration", str(bad)],
              f"{bad}: not JSON")  # fmt: skip
