"""CUDA-event timing shared by the microbenchmarks (bench_adamw, bench_gemm_shapes,
bench_tp_comm)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_ms(fn: Callable, iters: int = 20, warmup: int = 5, barrier: Callable | None = None):
    """Mean milliseconds of `fn()` on the current stream over `iters` calls after `warmup`
    (CUDA events); `barrier` (e.g. dist.barrier) runs between the warm-up and the timing."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if barrier is not None:
        barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
