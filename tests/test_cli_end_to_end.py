"""`gigatron train` end to end (issue 30, items 3 and 4): a --yaml-cfg with `lr: 1e-3` trains
(before: the string '1e-3' crashed the run after the model was built); rank 0 prints the
arguments that differ from their defaults and the rank -> (tp, pp, dp, cp, ep) table; the
program itself (`python -m gigatron.cli`) exits 2 with one line on a configuration mistake and
shows the traceback under GIGATRON_DEBUG=1."""

import os
import subprocess
import sys

import pytest

from gigatron.testing import run_distributed
from tests.training.test_resume_contract import MODEL, RUN, _cli, _lrs

pytestmark = pytest.mark.multirank


def test_yaml_values_go_through_the_flag_types(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("lr: 1e-3\nmin-lr: 1e-4\ntrain_iters: 2\nlr-decay-style: constant\n")
    argv = MODEL + [a for a in RUN if a not in ("--lr", "1e-3")] + ["--yaml-cfg", str(cfg)]
    ((rc, out, err),) = run_distributed(_cli, 1, args=([argv],), timeout=120)[0]
    assert rc == 0, err
    assert _lrs(out) == {1: 1e-3, 2: 1e-3}, out


def test_rank0_prints_the_changed_arguments_and_the_rank_layout():
    argv = MODEL + RUN + ["--train-iters", "1", "--tensor-model-parallel-size", "2"]
    (((rc0, out0, _),), ((rc1, out1, _),)) = run_distributed(_cli, 2, args=([argv],), timeout=120)
    assert rc0 == rc1 == 0
    lines = out0.splitlines()
    start = next(i for i, s in enumerate(lines) if "arguments that differ from the defaults" in s)
    table = lines.index("rank layout (2 ranks: tp 2 x pp 1 x dp 1 x cp 1, ep 1): "
                        "rank -> (tp, pp, dp, cp, ep)")  # fmt: skip
    changed = {s.split()[0]: s.split()[-1] for s in lines[start + 1 : table]}
    assert changed["tensor_model_parallel_size"] == "2" and changed["lr"] == "0.001"
    assert changed["kv_channels"] == "8" and changed["world_size"] == "2"  # resolved values
    assert "seed" in changed and "make_vocab_size_divisible_by" not in changed  # the default
    assert lines[table + 1 : table + 3] == [
        "      0 -> (0, 0, 0, 0, 0)",
        "      1 -> (1, 0, 0, 0, 0)",
    ]
    assert "rank layout" not in out1 and "arguments that differ" not in out1


def test_the_program_exits_2_with_one_line_and_shows_the_traceback_under_debug():
    argv = [sys.executable, "-m", "gigatron.cli", "train", *MODEL, *RUN, "--train-iters", "2",
            "--fp16", "--bf16"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "GIGATRON_DEBUG")}
    quiet = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 2, quiet.stderr
    assert quiet.stderr == "gigatron train: error: --fp16 and --bf16 are mutually exclusive\n"
    loud = subprocess.run(argv, env={**env, "GIGATRON_DEBUG": "1"}, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.rstrip().endswith("ValueError: --fp16 and --bf16 are mutually exclusive")
