"""Every script under examples/ runs on CPU ranks through torchrun (gloo) and prints what it shows.

Each test launches `python -m torch.distributed.run --standalone --nproc-per-node N ...` in a
subprocess and checks the printed result lines (losses, equal checkpoints, parity numbers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(nproc: int, *args: str, timeout: int = 150) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return proc.stdout


def _losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss(?:es)? \[?([0-9.]+)", out)]


@pytest.mark.timeout(180)
def test_simple_mcore_train_loop_through_alias(tmp_path):
    script = "examples/run_simple_mcore_train_loop.py"
    out = _torchrun(2, "-m", "gigatron.compat.megatron", script, "--ckpt-dir", str(tmp_path / "c"))
    losses = _losses(out)
    assert len(losses) == 5, out
    assert losses[-1] < losses[0], losses
    assert "loaded back equal" in out
    assert (tmp_path / "c" / "metadata.json").exists()
