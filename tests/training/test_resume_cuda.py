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


def _losses(flat: list[str], extra: list[str], port: int) -> dict[int, float]:
    env = dict(os.environ, NCCL_ALGO="Ring")  # --deterministic-mode on NCCL asks for it
    extra = [*flat, *extra]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    cmd = [*run, "--master-port", str(port), "-m", "gigatron.training.pretrain_gpt", *ARGS, *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)", out.stdout)
    return {int(i): float(x) for i, x in found}


@pytest.mark.parametrize("flat", [[], ["--no-flat-adam-step"]])
def test_resume_on_cuda_matches_the_uninterrupted_run(tmp_path, flat):
    full = _losses(flat, [], 29811)
    ckpt = str(tmp_path / "ckpt")
    first = _losses(flat, ["--save", ckpt, "--save-interval", "100", "--exit-interval", "6"], 29812)
    second = _losses(flat, ["--load", ckpt, "--save", ckpt, "--save-interval", "100"], 29813)
    assert sorted(first) == list(range(1, 7)) and sorted(second) == list(range(7, 13))
    assert full[12] < full[1]
    for it in range(1, 13):
        got = first.get(it, second.get(it))
        assert got == pytest.approx(full[it], rel=1e-4), (it, got, full[it])
