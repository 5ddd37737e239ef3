"""SM clock and board power of this rank's GPU while the timed steps run (bench_gpt.py).

Session 7 found that gpt-1.3b runs at the H200's 700 W limit, where the SM clock falls from
1980 MHz to 1425-1740 MHz and depends on the values multiplied (bench/reports/gemm-power-cap.md):
two runs compare kernels only at the same clock. `GpuSampler` polls `nvidia-smi` in a thread
during the timed window (no Python dependency; the GPU is named by its UUID, so it is this process's
device whatever CUDA_VISIBLE_DEVICES says) and summarises what it printed:

    with GpuSampler(torch.device("cuda", 0)) as s:
        ...timed steps...
    s.summary()  # {"sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean", "power_w_max",
                 #  "power_limit_w", "samples"} or None (CPU, no nvidia-smi, no samples)
"""

from __future__ import annotations

import shutil
import subprocess
import threading

import torch

QUERY = "clocks.sm,power.draw,power.limit"


def gpu_id(device: torch.device) -> str | None:
    """nvidia-smi's name for a CUDA device: 'GPU-<uuid>' (None off CUDA)."""
    if device.type != "cuda":
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # a torch without the field: no sampling
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def parse(text: str) -> dict | None:
    """Summary of `nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit --format=csv,
    noheader,nounits` lines (unparsable lines skipped; None when none parse)."""
    clocks, power, limit = [], [], None
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            clock, watts = float(parts[0]), float(parts[1])
        except ValueError:
            continue
        clocks.append(clock)
        power.append(watts)
        try:
            limit = float(parts[2])
        except ValueError:
            pass
    if not clocks:
        return None
    return {
        "sm_clock_mhz_mean": round(sum(clocks) / len(clocks)),
        "sm_clock_mhz_min": round(min(clocks)),
        "power_w_mean": round(sum(power) / len(power), 1),
        "power_w_max": round(max(power), 1),
        "power_limit_w": limit,
        "samples": len(clocks),
    }


class GpuSampler:
    """Polls `nvidia-smi` (one query a call, so nothing sits in a pipe buffer when the block
    ends) every `interval_ms` in a thread while the block runs (see the module docstring). Does
    nothing (summary None) off CUDA or without nvidia-smi on PATH."""

    def __init__(self, device: torch.device, interval_ms: int = 200, smi: str = "nvidia-smi"):
        self.gpu = gpu_id(device)
        self.smi = shutil.which(smi) if self.gpu else None
        self.interval_s = interval_ms / 1000
        self.thread: threading.Thread | None = None
        self.lines: list[str] = []
        self._stop = threading.Event()

    def _poll(self) -> None:
        cmd = [self.smi, "-i", self.gpu, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
        while True:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
                self.lines.extend(out.stdout.splitlines())
            except (OSError, subprocess.TimeoutExpired):
                pass
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> GpuSampler:
        if self.smi:
            self.thread = threading.Thread(target=self._poll, name="gpu-sampler", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is not None:
            self._stop.set()
            self.thread.join(timeout=10)

    def summary(self) -> dict | None:
        return parse("\n".join(self.lines))
