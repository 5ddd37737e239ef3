"""bench/optimizer/bench_optimizer_host.py prints the host time of each optimizer-step piece for the
torch and the flat Adam step (a CPU proxy for the GPU's host gaps)."""

import json
import os
import subprocess
import sys

import pytest

from tests._paths import REPO

ROOT = str(REPO)


@pytest.mark.parametrize("flat", [False, True])
def test_host_bench_reports_every_piece(flat):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "optimizer", "bench_optimizer_host.py")]
    cmd += ["--layers", "2", "--reps", "2"] + (["--flat"] if flat else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line[len("RESULT ") :])
    assert r["flat_step"] is flat and r["tensors"] == 2 * 12 + 5  # 12 per layer + embeddings/norm
    for key in ("nan_check_ms", "prepare_grads_ms", "grad_norm_ms", "whole_step_ms"):
        assert r[key] > 0.0
