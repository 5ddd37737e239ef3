"""Profiling helpers of bench/bench_gpt.py: kernel time by category, GPU idle gaps, host syncs.

`profile_step` is also used by bench/compare_profile.py for the plain-PyTorch anchor.
"""

from __future__ import annotations

import json

import torch


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
    return [f"{w.filename}:{w.lineno}: {str(w.message)[:80]}" for w in caught][:20]


def _category(name: str) -> str:
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if any(k in low for k in ("nvjet", "gemm", "cutlass", "xmma")):
        return "gemm"
    if any(k in low for k in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if "multi_tensor_apply" in low or "adam" in low:
        return "optimizer"
    if low.startswith("triton_"):
        return "triton (compiled elementwise/norm/reduction)"
    return "other (eager elementwise, copies, embedding)"


def _idle_gaps(prof, n: int) -> dict:
    """GPU idle time between kernels (ms per step) and the 12 largest gaps with the kernels
    around them: where the GPU waits on the CPU (launch overhead, host syncs)."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and "#" not in e.name  # not the optimizer annotation
    )
    gaps, reach = [], None
    for (start, _end, name), prev in zip(spans[1:], spans[:-1]):
        reach = prev[1] if reach is None else max(reach, prev[1])
        if start > reach:
            gaps.append((start - reach, prev[2][:70], name[:70]))
    by_next: dict[str, float] = {}
    for gap, _, after in gaps:
        by_next[after] = by_next.get(after, 0.0) + gap / n / 1e3
    return {
        "idle_ms_per_step": round(sum(g[0] for g in gaps) / n / 1e3, 2),
        "largest_us": [(round(g, 1), before, after) for g, before, after in sorted(gaps)[-12:]],
        "by_next_kernel_ms": dict(sorted(by_next.items(), key=lambda x: -x[1])[:12]),
    }


def profile_step(step, path: str | None, iter_s: float, n: int = 3) -> dict:
    """Profile `n` steps; write the GPU kernels (device time per step, by category and the top
    30) to `path`. `busy` = kernel time / measured step time (below 1: the GPU waits on the
    CPU, or kernels on several streams overlap)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
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
    summary = {
        "idle": _idle_gaps(prof, n),
        "kernel_ms_per_step": round(total, 2),
        "step_ms": round(iter_s * 1e3, 2),
        "busy": round(total / (iter_s * 1e3), 3),
        "by_category_ms": {k: round(v, 2) for k, v in sorted(by_cat.items(), key=lambda x: -x[1])},
    }
    if path:
        with open(path, "w") as f:
            json.dump({**summary, "top": top}, f, indent=1)
    return summary
