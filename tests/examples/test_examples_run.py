"""Every script under examples/ runs on CPU ranks through torchrun (gloo) and prints what it shows.

Each test launches `python -m torch.distributed.run --standalone --nproc-per-node N ...` in a
subprocess and checks the printed result lines (losses, equal checkpoints, parity numbers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from tests._paths import REPO

pytestmark = pytest.mark.multirank


ROOT = REPO


def _torchrun(nproc: int, *args: str, timeout: int = 150, gpu: bool = False, cwd=ROOT,
              quiet: bool = False) -> str:  # fmt: skip
    """stdout of `torchrun args`; `quiet`: stderr holds no Python warning either."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks over gloo
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert not quiet or "Warning" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def _losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss(?:es)? \[?([0-9.]+)", out)]


@pytest.mark.timeout(180)
def test_simple_mcore_train_loop_through_alias(tmp_path):
    """Without warnings, and by default into its own folder under runs/ (not learn.md's ckpt/)."""
    script = os.path.join(ROOT, "examples", "run_simple_mcore_train_loop.py")
    out = _torchrun(2, "-m", "gigatron.compat.megatron", script, cwd=tmp_path, quiet=True)
    losses = _losses(out)
    assert len(losses) == 5, out
    assert losses[-1] < losses[0], losses
    assert "loaded back equal" in out
    assert (tmp_path / "runs" / "run_simple_mcore_train_loop" / "metadata.json").exists()
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.timeout(300)
def test_simple_mcore_train_loop_through_alias_on_two_gpus(tmp_path):
    script = "examples/run_simple_mcore_train_loop.py"
    out = _torchrun(2, "-m", "gigatron.compat.megatron", script, "--ckpt-dir", str(tmp_path / "c"),
                    gpu=True)  # fmt: skip
    assert len(_losses(out)) == 5 and "loaded back equal" in out, out


def _flag(out: str, text: str) -> bool:
    return f"{text}: True" in out


@pytest.mark.timeout(120)
def test_tensor_parallel_example():
    out = _torchrun(2, "examples/tensor_parallel.py")
    assert _flag(out, "tensor parallel MLP matches the unsharded MLP"), out
    assert "fc1.weight (32, 16)" in out


@pytest.mark.timeout(120)
def test_pipeline_parallel_example():
    out = _torchrun(2, "examples/pipeline_parallel.py", "--steps", "6")
    assert "pp rank 1: layers [3, 4], embedding False, output layer True" in out
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.1, losses


@pytest.mark.timeout(180)
def test_hybrid_tp_pp_example_matches_pipeline_only():
    hybrid = _torchrun(4, "examples/hybrid_tp_pp.py", "--steps", "3")
    assert "tp rank 1, pp rank 1, dp rank 0, layers [3, 4], linear_qkv (48, 32)" in hybrid
    pp_only = _torchrun(2, "examples/hybrid_tp_pp.py", "--tp", "1", "--steps", "3")
    a = [float(x) for x in re.findall(r"loss ([0-9.]+)", hybrid)]
    b = [float(x) for x in re.findall(r"loss ([0-9.]+)", pp_only)]
    assert len(a) == 3 and a == pytest.approx(b, abs=2e-4), (a, b)


@pytest.mark.timeout(120)
def test_moe_expert_parallel_example():
    out = _torchrun(2, "examples/moe_expert_parallel.py", "--steps", "4")
    assert "ep rank 1, holds experts [2, 3] of 4" in out
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.timeout(120)
def test_dist_checkpoint_example_reshards(tmp_path):
    out = _torchrun(2, "examples/dist_checkpoint.py", "--ckpt-dir", str(tmp_path))
    assert "linear_qkv per rank (48, 32)" in out and "linear_qkv per rank (96, 32)" in out
    assert _flag(out, "loaded at a different layout equal"), out


@pytest.mark.timeout(120)
def test_mixed_precision_grad_accum_example():
    out = _torchrun(2, "examples/mixed_precision_grad_accum.py", "--steps", "4")
    assert _flag(out, "gradient accumulation equals the large batch"), out
    assert "model param dtype torch.bfloat16, optimizer main param dtype torch.float32" in out
    assert _flag(out, "bf16 model param == bf16(fp32 main param) after the steps"), out
    losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
