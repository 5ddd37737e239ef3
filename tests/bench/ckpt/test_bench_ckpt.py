"""bench/ckpt/bench_ckpt.py on CPU: the tiny config end to end (gigatron and megatron-core's
writer), and the verification it reports really catches a load that returned the wrong bytes."""

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from bench.ckpt import bench_ckpt
from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing import ShardedTensor
from tests._paths import REPO, with_oracle

ROOT = str(REPO)


def _run(*argv) -> dict:
    env = with_oracle(dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "bench/ckpt/bench_ckpt.py", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return {r["impl"]: r for r in (json.loads(ln[len("RESULT ") :]) for ln in lines)}


def _check_timings(r: dict, repeats: int) -> None:
    assert "error" not in r and "skipped" not in r, r
    assert r["verified"] is True and r["verified_tensors"] > 0, r
    assert r["config"] == "tiny" and r["repeats_done"] == repeats
    assert len(r["save_s_all"]) == len(r["load_s_all"]) == repeats
    assert r["save_s"] == min(r["save_s_all"]) > 0 and r["load_s"] == min(r["load_s_all"]) > 0
    assert r["save_s_mean"] >= r["save_s"] and r["load_s_mean"] >= r["load_s"]
    gb = r["bytes_on_disk"] / 1e9
    assert r["save_gbps"] == pytest.approx(gb / r["save_s"])
    assert r["load_gbps"] == pytest.approx(gb / r["load_s"])
    # bf16 params + fp32 main params + two fp32 Adam moments: 14 bytes per parameter.
    assert r["payload_bytes"] == 14 * r["params"]
    assert r["payload_bytes"] < r["bytes_on_disk"] < 1.3 * r["payload_bytes"]
    assert r["versions"]["torch"] == torch.__version__ and r["device_name"] and r["date"]


def test_tiny_config_both_impls_verified(tmp_path):
    results = _run("--config", "tiny", "--device", "cpu", "--repeats", "2", "--dir", str(tmp_path))
    assert sorted(results) == ["gigatron", "megatron"]
    _check_timings(results["gigatron"], 2)
    assert results["gigatron"]["payload"].startswith("GPTModel + optimizer")
    assert results["gigatron"]["params"] == 134912  # tiny: 2 layers, h 64, vocab 512, seq 32
    if "skipped" not in results["megatron"]:  # megatron-core installed: its writer on CPU
        _check_timings(results["megatron"], 2)
        assert results["megatron"]["payload"].startswith("plain ShardedTensors")
        assert results["megatron"]["verified_tensors"] == results["gigatron"]["verified_tensors"]
        assert results["megatron"]["versions"]["megatron_core"]
    assert os.listdir(tmp_path) == []  # every checkpoint deleted


def test_plain_optimizer_evicted_load_training_path_and_time_budget(tmp_path):
    results = _run("--config", "tiny", "--device", "cpu", "--repeats", "3", "--impls",
                   "gigatron,gigatron-training", "--no-dist-opt", "--drop-cache",
                   "--time-budget", "0.01", "--dir", str(tmp_path))  # fmt: skip
    for r in results.values():
        assert r["repeats"] == 3  # asked for; the budget leaves time for the first one only
        _check_timings(r, 1)
        assert r["dist_opt"] is False and r["load_source"] == "disk (evicted)"
    assert results["gigatron-training"]["payload"].startswith("save_checkpoint/load_checkpoint")
    # Same tensors as the bare dist_checkpointing payload, plus RNG states, args and the tracker.
    assert results["gigatron-training"]["payload_bytes"] == results["gigatron"]["payload_bytes"]
    assert results["gigatron-training"]["bytes_on_disk"] > results["gigatron"]["bytes_on_disk"]


@pytest.mark.gpu
def test_tiny_config_cuda_real_megatron_models(tmp_path):
    """Not run on the CPU machine: megatron-core's own GPTModel and optimizer on CUDA."""
    pytest.importorskip("megatron.core")
    results = _run("--config", "tiny", "--device", "cuda", "--repeats", "1", "--dir", str(tmp_path))
    for impl in ("gigatron", "megatron"):
        _check_timings(results[impl], 1)
    assert results["megatron"]["payload"] == "GPTModel + optimizer (megatron-core)"
    assert results["megatron"]["params"] == results["gigatron"]["params"]


class _NoOpLoad:
    """A `dist_checkpointing` whose load returns the request's (NaN) tensors untouched, or
    whose load flips one bit of one tensor."""

    def __init__(self, flip: bool):
        self.flip = flip

    def save(self, sd, d):
        dc.save(sd, d)

    def load(self, request, d):
        if not self.flip:
            return {k: v.data for k, v in request.items()}
        out = dc.load(request, d)
        out["b"].view(torch.int16)[0] ^= 1  # bf16 bit flip
        return out


@pytest.mark.parametrize("flip", [False, True])
def test_verification_catches_a_wrong_load(tmp_path, flip):
    a, b = torch.randn(4, 3), torch.randn(5).bfloat16()

    def make_state():
        return {k: ShardedTensor.from_rank_offsets(k, t) for k, t in (("a", a), ("b", b))}

    args = argparse.Namespace(repeats=1, device="cpu", drop_cache=False)
    out = bench_ckpt._time_repeats(args, _NoOpLoad(flip), make_state, str(tmp_path))
    assert out["verified"] is False and out["first_mismatch"] == ("b" if flip else "a")
    good = bench_ckpt._time_repeats(args, dc, make_state, str(tmp_path))
    assert good["verified"] is True and good["verified_tensors"] == 2
