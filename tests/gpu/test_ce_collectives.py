"""Copy-engine TP collectives (gigatron/core/tensor_parallel/_ce_collectives.py) equal NCCL's
bitwise on 2 GPUs, eager and compiled, several in flight (bench/bench_tp_comm.py --check-only;
skipped without 2 CUDA devices)."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_copy_engine_collectives_match_nccl():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29681", os.path.join(ROOT, "bench", "bench_tp_comm.py"),
           "--check-only"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
