"""bench/_lib/power.py: the nvidia-smi sampler that bench_gpt.py runs over its timed steps
(a fake nvidia-smi on PATH stands in for the real one), and compare.py's clock / power column."""

import stat
import time

import torch

from bench._lib import power as _bench_power
from bench.tools import compare


def test_parse_summarises_and_skips_bad_lines():
    text = "1980, 120.5, 700.00\n[N/A], 3, 700\n1500, 699.5, 700.00\nnoise\n1620, 690.0, 700.00\n"
    got = _bench_power.parse(text)
    assert got == {
        "sm_clock_mhz_mean": 1700,
        "sm_clock_mhz_min": 1500,
        "power_w_mean": 503.3,
        "power_w_max": 699.5,
        "power_limit_w": 700.0,
        "samples": 3,
    }
    assert _bench_power.parse("") is None and _bench_power.parse("x, y, z\n") is None


def test_sampler_polls_nvidia_smi_during_the_block(tmp_path, monkeypatch):
    """The sampler queries nvidia-smi with this GPU's UUID and the query while the block runs,
    stops at its end and summarises the answers; off CUDA it does nothing."""
    fake = tmp_path / "nvidia-smi"
    log = tmp_path / "calls.txt"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho "1700, 650.5, 700.00"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(_bench_power, "gpu_id", lambda d: "GPU-1234" if d.type == "cuda" else None)
    sampler = _bench_power.GpuSampler(torch.device("cuda", 0), interval_ms=50, smi=str(fake))
    with sampler:
        time.sleep(0.6)
    assert not sampler.thread.is_alive()  # stopped
    calls = log.read_text().splitlines()
    time.sleep(0.2)
    assert len(log.read_text().splitlines()) == len(calls) >= 2  # no query after the block
    args = calls[0].split()
    assert args[:2] == ["-i", "GPU-1234"] and f"--query-gpu={_bench_power.QUERY}" in args
    summary = sampler.summary()
    assert summary["sm_clock_mhz_min"] == 1700 and summary["power_w_max"] == 650.5
    assert summary["samples"] == len(calls)
    off = _bench_power.GpuSampler(torch.device("cpu"), smi=str(fake))
    with off:
        pass
    assert off.thread is None and off.summary() is None


def test_compare_table_shows_clock_and_power():
    row = {
        "impl": "gigatron-x", "config": "gpt-1.3b", "gpus": 1, "tp": 1, "dp": 1,
        "tokens_per_s": 63307, "tflops_per_gpu": 574.4, "mfu": 0.581, "peak_mem_gb": 20.4,
        "gpu_power": {"sm_clock_mhz_mean": 1650, "power_w_mean": 690.2},
    }  # fmt: skip
    lines = compare.table([row, dict(row, gpu_power=None)])
    assert lines[2].endswith("| 20.4 | 1650 / 690.2 |"), lines[2]
    assert lines[3].endswith("| 20.4 |  |"), lines[3]


def test_compare_skips_rows_without_throughput_and_keeps_anchor_init_out_of_targets():
    """A results file with bench_ckpt rows (impl 'gigatron', no TFLOP/s) must not crash ratios /
    targets (2026-11-30-gpu-results.jsonl did); an --anchor-init run is never the target's best."""
    run = {
        "impl": "gigatron-x", "config": "gpt-1.3b", "gpus": 1, "tp": 1, "dp": 1,
        "tokens_per_s": 60000, "tflops_per_gpu": 550.0, "mfu": 0.556, "peak_mem_gb": 20.4,
        "switches": {"anchor_init": False},
    }  # fmt: skip
    fast = dict(run, impl="gigatron-x-anchor-init", tflops_per_gpu=600.0, tokens_per_s=65000)
    fast["switches"] = {"anchor_init": True}
    ckpt = {"impl": "gigatron", "config": "gpt-1.3b", "dist_opt": True, "setup_s": 5.1}
    ref = dict(run, impl="torch-sdpa-compile", switches=None)
    rows = [run, fast, ckpt, ref]
    ratios = compare.ratios(rows)
    assert any("| gigatron-x | torch-sdpa-compile |" in r for r in ratios), ratios
    assert any("| gigatron-x-anchor-init | torch-sdpa-compile |" in r for r in ratios), ratios
    targets = compare.targets(rows)
    assert any("| gigatron-x | 550.0 | NO |" in t for t in targets), targets
    assert not any("anchor-init" in t for t in targets), targets
