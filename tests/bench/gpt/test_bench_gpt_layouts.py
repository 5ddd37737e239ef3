"""bench/gpt/bench_gpt.py on CPU ranks (gloo) in the PP, CP and TP x PP layouts.

Each layout runs the harness through `python -m torch.distributed.run` and must print a RESULT
JSON with its layout fields; with the layout-invariant init (`--init auto` on CPU) the loss of
step 0 equals the one-rank run's, and so does the loss after one optimizer step (the tied
embedding grads crossing the pipeline, the DP x CP grad reduction and the schedule are right).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests._paths import REPO

pytestmark = pytest.mark.multirank


ROOT = REPO
COMMON = ["--config", "tiny", "--device", "cpu", "--warmup", "1", "--steps", "1"]


def _bench(nproc: int, *args: str, gpu: bool = False, timeout: int = 120) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks over gloo
    common = ["--config", "tiny", "--warmup", "1", "--steps", "1"] if gpu else COMMON
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "bench/gpt/bench_gpt.py", *common, *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-4000:]  # rank 0 only
    return json.loads(lines[0][len("RESULT ") :])


@pytest.fixture(scope="module")
def one_rank() -> dict:
    return _bench(1)


def _same_losses(result: dict, reference: dict) -> None:
    a, b = result["first_loss"], reference["first_loss"]
    assert abs(a - b) <= 1e-6 * abs(b), (a, b)
    assert abs(result["loss"] - reference["loss"]) <= 1e-4, (result["loss"], reference["loss"])


@pytest.mark.timeout(120)
def test_one_rank_keeps_the_plain_step(one_rank):
    r = one_rank
    assert (r["gpus"], r["tp"], r["dp"], r["pp"], r["cp"], r["num_microbatches"]) == (
        1,
        1,
        1,
        1,
        1,
        1,
    )
    assert r["vpp"] is None and r["cp_comm_type"] is None and r["switches"]["ddp"] is False
    assert r["init"] == "invariant" and 4.0 < r["first_loss"] < 8.0  # ~ln(512) at init
    assert r["gpu_power"] is None  # CPU: no nvidia-smi sampling


@pytest.mark.timeout(120)
def test_pipeline_two_stages_matches_one_rank(one_rank):
    r = _bench(2, "--pp", "2")
    assert (r["gpus"], r["pp"], r["dp"], r["cp"], r["num_microbatches"]) == (2, 2, 1, 1, 4)
    assert r["switches"]["ddp"] is True
    # global tokens per step: micro_batch * seq * num_microbatches * dp
    assert r["tokens_per_s"] == pytest.approx(2 * 32 * 4 / r["iter_s"], rel=0.05)
    _same_losses(r, one_rank)


@pytest.mark.timeout(120)
def test_pipeline_with_wgrad_fusion_matches_one_rank(one_rank):
    """gradient_accumulation_fusion under PP: the last stage's marked output weight (tied to the
    first stage's embedding) gets its chunked-CE grad in main_grad; one step as one rank."""
    r = _bench(2, "--pp", "2", "--grad-acc-fusion")
    assert r["switches"]["grad_acc_fusion"] is True
    _same_losses(r, one_rank)


@pytest.mark.timeout(120)
def test_context_parallel_matches_one_rank(one_rank):
    r = _bench(2, "--cp", "2")
    assert (r["gpus"], r["cp"], r["cp_comm_type"], r["dp"], r["pp"]) == (2, 2, "p2p", 1, 1)
    assert r["num_microbatches"] == 1
    assert r["tokens_per_s"] == pytest.approx(2 * 32 / r["iter_s"], rel=0.05)  # whole sequence
    _same_losses(r, one_rank)


@pytest.mark.timeout(150)
def test_tensor_and_pipeline_parallel_matches_one_rank(one_rank):
    r = _bench(4, "--tp", "2", "--pp", "2")
    assert (r["gpus"], r["tp"], r["pp"], r["dp"], r["num_microbatches"]) == (4, 2, 2, 1, 4)
    _same_losses(r, one_rank)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.timeout(900)
def test_pp_and_cp_on_two_gpus():
    """The fast path (bf16, compiled layers) in PP and CP on GPUs; same init as one GPU."""
    reference = _bench(1, "--init", "invariant", gpu=True, timeout=300)
    for args in (["--pp", "2"], ["--pp", "2", "--vpp", "2", "--num-layers", "4"], ["--cp", "2"]):
        r = _bench(2, "--init", "invariant", *args, gpu=True, timeout=300)
        assert r["gpus"] == 2 and r["tokens_per_s"] > 0, r
        if "--num-layers" not in args:  # bf16: equal up to rounding
            assert r["first_loss"] == pytest.approx(reference["first_loss"], rel=2e-2), args
