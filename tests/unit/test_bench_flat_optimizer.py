"""bench_gpt.py --optimizer flat (gigatron's FlatAdamW over DDP's grad buffers) trains like the
torch AdamW step on CPU: same losses after four steps, and it refuses to run without DDP."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(*flags):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "bench_gpt.py"), "--config", "tiny"]
    cmd += ["--device", "cpu", "--steps", "3", "--warmup", "1", *flags]
    env = dict(os.environ, MASTER_PORT=str(29000 + os.getpid() % 1000))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return out, (json.loads(lines[-1][7:]) if lines else None)


def test_flat_optimizer_matches_torch_adamw_in_the_bench():
    _, flat = _bench("--ddp", "on", "--optimizer", "flat")
    _, ref = _bench("--ddp", "on", "--optimizer", "torch-foreach")
    assert flat["switches"]["optimizer"] == "flat"
    assert flat["loss"] == ref["loss"] and flat["first_loss"] == ref["first_loss"]
    assert flat["loss"] < flat["first_loss"] - 0.05  # the optimizer really stepped


def test_flat_optimizer_needs_ddp():
    out, result = _bench("--ddp", "off", "--optimizer", "flat")
    assert result is None and out.returncode != 0
    assert "--optimizer flat needs DDP" in out.stderr
