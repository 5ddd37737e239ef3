"""Resume on CUDA (pretrain_gpt through torchrun, one GPU, bf16, the distributed optimizer): a run
stopped by --exit-interval 6 (saved there) and resumed with --load ends at the loss of an
uninterrupted 12-iteration run, with the flat Adam step (the default on CUDA) and with torch's
fused Adam (--no-flat-adam-step: its step counts live on the GPU and must stay
there through the load)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.multirank,
]

# fmt: off
ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--vocab-size", "512", "--train-iters", "12", "--lr", "1e-3",
        "--min-lr", "1e-4", "--mock-data", "--bf16", "--use-distributed-optimizer",
        "--accumulate-allreduce-grads-in-fp32", "--clip-grad", "1.0", "--log-interval", "1",
        "--eval-iters", "0", "--eval-interval", "1000", "--no-progress-bar", "--seed", "7",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--deterministic-mode"]
# fmt: on


def _launch(flat: list[str], extra: list[str], port: int) -> subprocess.Popen:
    env = dict(os.environ, NCCL_ALGO="Ring")  # --deterministic-mode on NCCL asks for it
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    cmd = [*run, "--master-port", str(port), "-m", "gigatron.training.pretrain_gpt", *ARGS]
    return subprocess.Popen(
        [*cmd, *flat, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _losses(proc: subprocess.Popen) -> dict[int, float]:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    found = re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)", stdout)
    return {int(i): float(x) for i, x in found}


VARIANTS = {"flat-adam-step": [], "torch-fused-adam": ["--no-flat-adam-step"]}


def test_resume_on_cuda_matches_the_uninterrupted_run(tmp_path):
    """Both optimizer variants at once (the GPU has room for four tiny runs side by side): the
    uninterrupted and the interrupted runs together, then the two resumes."""
    ckpt = {name: str(tmp_path / name) for name in VARIANTS}
    stop = ["--save-interval", "100", "--exit-interval", "6"]
    full, first = {}, {}
    for i, (name, flat) in enumerate(VARIANTS.items()):
        full[name] = _launch(flat, [], 29811 + 4 * i)
        first[name] = _launch(flat, ["--save", ckpt[name], *stop], 29812 + 4 * i)
    full = {name: _losses(proc) for name, proc in full.items()}
    first = {name: _losses(proc) for name, proc in first.items()}
    resume = ["--save-interval", "100"]
    second = {
        name: _launch(flat, ["--load", ckpt[name], "--save", ckpt[name], *resume], 29813 + 4 * i)
        for i, (name, flat) in enumerate(VARIANTS.items())
    }
    second = {name: _losses(proc) for name, proc in second.items()}
    for name in VARIANTS:
        assert sorted(first[name]) == list(range(1, 7)), name
        assert sorted(second[name]) == list(range(7, 13)), name
        assert full[name][12] < full[name][1], name
        for it in range(1, 13):
            got = first[name].get(it, second[name].get(it))
            assert got == pytest.approx(full[name][it], rel=1e-4), (name, it, got, full[name][it])
