"""`gigatron plot`: the curves come from the run's TensorBoard scalars (the tags the training
log writes) or, without event files, from its log lines; each curve is an SVG element."""

import re

import pytest

from gigatron.cli import main as cli_main
from gigatron.tools import plot

pytest.importorskip("matplotlib")

LOG = """\
 iteration        2/       4 | consumed samples:         16 | elapsed time per iteration (ms): 70.3 | learning rate: 9.000000E-04 | lm loss: 4.848366E+00 | grad norm: 1.342 | number of skipped iterations:   0 | number of nan iterations:   0 | tokens/s: 10618 | throughput per GPU (TFLOP/s/GPU): 0.001 | MFU: n/a | max RSS 0.51 GiB
 iteration        4/       4 | consumed samples:         32 | elapsed time per iteration (ms): 60.1 | learning rate: 8.000000E-04 | lm loss: 4.780000E+00 | grad norm: 1.300 | number of skipped iterations:   0 | number of nan iterations:   0 | tokens/s: 11000 | throughput per GPU (TFLOP/s/GPU): 0.001 | MFU: n/a | max RSS 0.51 GiB
validation loss at iteration 4 | lm loss value: 4.701000E+00 | lm loss PPL: 1.100000E+02
"""  # noqa: E501


def _curves(svg) -> list[str]:
    return re.findall(r'id="curve-([^"]+)"', svg.read_text())


def test_tensorboard_scalars(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    writer = SummaryWriter(log_dir=str(run / "tb"))
    for step in (1, 2, 3):
        for tag, value in (("lm loss", 5.0 - step), ("learning-rate", 1e-3), ("grad-norm", 1.0),
                           ("tokens-per-sec", 100.0 * step)):  # fmt: skip
            writer.add_scalar(tag, value, step)
    writer.add_scalar("lm loss validation", 4.5, 3)
    writer.close()
    assert plot.read_run(str(run))["lm loss"] == [(1, 4.0), (2, 3.0), (3, 2.0)]
    svg = tmp_path / "curves.svg"
    assert cli_main(["plot", str(run), "--out", str(svg)]) == 0
    assert sorted(_curves(svg)) == sorted(
        ["lm loss", "lm loss validation", "learning-rate", "grad-norm", "tokens-per-sec"]
    )
    assert "plot: " in capsys.readouterr().out


def test_log_lines_and_an_empty_run(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    series = plot.read_run(str(tmp_path))
    assert series["lm loss"] == [(2, 4.848366), (4, 4.78)]
    assert series["tokens-per-sec"] == [(2, 10618.0), (4, 11000.0)]
    assert series["lm loss validation"] == [(4, 4.701)]
    svg = tmp_path / "curves.svg"
    assert cli_main(["plot", str(log), "--out", str(svg)]) == 0
    assert len(_curves(svg)) == 5
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["plot", str(empty), "--out", str(svg)]) == 2
    assert "found no scalars" in capsys.readouterr().err
