"""Profiling helpers of bench/gpt/bench_gpt.py: kernel time by category, GPU idle gaps, host syncs.

`profile_step` is also used by bench/gpt/compare_profile.py for the plain-PyTorch anchor.
"""

from __future__ import annotations

import json

import torch

from gigatron.training._profiler import idle_gaps as _idle_gaps
from gigatron.training._profiler import kernel_category


def host_syncs(step) -> list[str]:
    """Run one step with CUDA sync debugging on; return where each host sync came from."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # only the syncs themselves ("called a synchronizing CUDA operation"), not the notice that
    # sync debug mode is a prototype, which setting the mode emits
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    return [f"{w.filename}:{w.lineno}: {str(w.message)[:80]}" for w in syncs][:20]


_category = kernel_category


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def _length(spans) -> float:
    return sum(e - s for s, e in spans)


def _intersection(a, b) -> float:
    """Total length of the overlap of two sorted lists of disjoint spans."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _comm_overlap(kernels: list[tuple[float, float, str]], n: int) -> dict:
    """NCCL / symmetric-memory communication kernels against everything else (ms per step):
    `comm` = time some comm kernel runs, `hidden` = of that, time a compute kernel runs too,
    `exposed` = comm - hidden (the GPU only communicates)."""
    comm_names = ("nccl", "symm", "cross_device", "copy_engine")
    comm = _union([(s, e) for s, e, k in kernels if any(c in k.lower() for c in comm_names)])
    comp = _union([(s, e) for s, e, k in kernels if not any(c in k.lower() for c in comm_names)])
    c, h = _length(comm) / n / 1e3, _intersection(comm, comp) / n / 1e3
    return {
        "comm_ms": round(c, 2),
        "hidden_ms": round(h, 2),
        "exposed_ms": round(c - h, 2),
        "compute_busy_ms": round(_length(comp) / n / 1e3, 2),
    }


def _write_trace(kernels: list[tuple[float, float, str]], path: str, n: int) -> None:
    """One step's kernels (the last of the n profiled) as [start_us, dur_us, name], gzipped."""
    import gzip

    kernels = sorted(kernels)
    per_step = len(kernels) // n
    last = kernels[-per_step:] if per_step else kernels
    t0 = last[0][0] if last else 0.0
    rows = [[round(s - t0, 1), round(e - s, 1), k[:90]] for s, e, k in last]
    with gzip.open(path, "wt") as f:
        json.dump(rows, f)


def profile_step(step, path: str | None, iter_s: float, n: int = 3, trace: str | None = None):
    """Profile `n` steps; write the GPU kernels (device time per step, by category and the top
    30) to `path`. `busy` = kernel time / measured step time (below 1: the GPU waits on the
    CPU, or kernels on several streams overlap). `comm`: communication kernels hidden behind
    compute or exposed. `trace`: also write the last step's kernel timeline there."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kernels = [  # not the ranges drawn on the GPU timeline (they span kernels: counted twice)
        e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and "#" not in e.key
    ]
    total = sum(e.self_device_time_total for e in kernels) / n / 1e3  # ms per step
    by_cat: dict[str, float] = {}
    for e in kernels:
        cat = _category(e.key)
        by_cat[cat] = by_cat.get(cat, 0.0) + e.self_device_time_total / n / 1e3
    top = [
        {
            "kernel": e.key[:140],
            "ms_per_step": round(e.self_device_time_total / n / 1e3, 3),
            "calls_per_step": e.count // n,
        }
        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:30]
    ]
    spans = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and "#" not in e.name
    ]
    if trace:
        _write_trace(spans, trace, n)
    summary = {
        "idle": _idle_gaps(prof, n),
        "comm": _comm_overlap(spans, n),
        "kernel_ms_per_step": round(total, 2),
        "step_ms": round(iter_s * 1e3, 2),
        "busy": round(total / (iter_s * 1e3), 3),
        "by_category_ms": {k: round(v, 2) for k, v in sorted(by_cat.items(), key=lambda x: -x[1])},
    }
    if path:
        with open(path, "w") as f:
            json.dump({**summary, "top": top}, f, indent=1)
    return summary
