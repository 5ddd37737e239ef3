"""Measure the calibration table `gigatron estimate --calibration` prices a step with.

    python3 bench/estimate/calibrate.py --out gigatron/tools/estimate/calibration/h200.json
    python3 bench/estimate/calibrate.py --trace-config "--num-layers 24 ..." --out ...
    torchrun --nproc-per-node 2 bench/estimate/calibrate.py --out ...  # + collectives over NVLink

On one CUDA GPU, bf16: GEMM throughput over a grid of (m, n, k) plus every GEMM shape of the
`--trace-config` models (the estimator's meta trace lists them), causal flash-SDPA forward and
backward throughput, device memory bandwidth (a large copy), host time of one small eager op;
with several ranks also all-reduce / all-gather / reduce-scatter bus bandwidth by size. Writes the
table (format in gigatron/tools/estimate/timing.py) and prints `RESULT {json}` (a summary).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shlex
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

GRID = (1024, 4096, 16384)


def _cuda_time(fn, *, min_s: float = 0.05, warmup: int = 3) -> float:
    """Seconds per call, CUDA events over enough calls to last `min_s`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    n, elapsed = 1, 0.0
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        elapsed = start.elapsed_time(end) / 1e3
        if elapsed >= min_s or n >= 1000:
            return elapsed / n
        n *= 4


def traced_shapes(configs: list[str]) -> tuple[set, set]:
    """(GEMM (m, n, k), attention (b, heads, seq, head_dim)) of each config's one-GPU model."""
    from gigatron.tools.estimate.args import estimate_args
    from gigatron.tools.estimate.report import estimate_rank

    gemms, attn = set(), set()
    for flags in configs:
        args = estimate_args([*shlex.split(flags), "--world-size", "1"])
        rank = estimate_rank(args, 0, keep_traces=True)
        for tr in rank["traces"]:
            gemms.update((m * b, n, k, layout) for m, n, k, b, layout in tr.gemms)
            attn.update((b, h, sq, d) for b, h, sq, _, d, _, _ in tr.attention)
    return gemms, attn


def _operand(rows: int, cols: int, transposed: bool, std: float) -> torch.Tensor:
    shape = (cols, rows) if transposed else (rows, cols)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * std
    return x.t() if transposed else x


def gemm_rows(shapes) -> list[dict]:
    """TFLOP/s of a[m, k] @ b[k, n] per (m, n, k, layout). Activation-like N(0, 1) times
    weight-like N(0, 0.02) values: at the power cap the clock depends on the values
    (bench/reports/gemm-power-cap.md)."""
    rows = []
    for m, n, k, layout in sorted(shapes):
        a = _operand(m, k, layout[0] == "t", 1.0)
        b = _operand(k, n, layout[1] == "t", 0.02)
        s = _cuda_time(lambda a=a, b=b: a @ b)
        flops = 2 * m * n * k
        rows.append(
            {"m": m, "n": n, "k": k, "layout": layout, "tflops": round(flops / s / 1e12, 1)}
        )
    return rows


def attention_rows(shapes) -> list[dict]:
    """Causal SDPA with bench_gpt's fast-path backends (cuDNN, then flash, then efficient)."""
    from gigatron.core.transformer.fast_path import sdpa_backends

    with sdpa_backends(["cudnn", "flash", "efficient"]):
        return [_attention_row(*shape) for shape in sorted(shapes)]


def _attention_row(b: int, h: int, s: int, d: int) -> dict:
    """Forward and backward TFLOP/s of one causal SDPA shape (backward = fwd+bwd - fwd)."""
    q, k, v = (
        torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    fwd = _cuda_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    both = _cuda_time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    )
    flops = 4 * b * h * s * s * d / 2
    return {
        "b": b, "heads": h, "seq": s, "head_dim": d,
        "fwd_tflops": round(flops / fwd / 1e12, 1),
        "bwd_tflops": round(2 * flops / max(both - fwd, 1e-9) / 1e12, 1),
    }  # fmt: skip


def memory_gbps() -> float:
    x = torch.empty(2**30 // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    s = _cuda_time(lambda: y.copy_(x))
    return round(2 * x.numel() * 2 / s / 1e9, 1)


def op_overhead_us() -> float:
    """Host seconds of one small eager op (dispatch + launch), the GPU never the bottleneck."""
    x = torch.zeros(16, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return round(host / n * 1e6, 2)


def collective_rows() -> dict:
    world = dist.get_world_size()
    out = {"allreduce": [], "allgather": [], "reduce_scatter": []}
    for nbytes in (2**20, 2**24, 2**27, 2**29):
        n = nbytes // 2
        full = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
        ops = {
            "allreduce": lambda full=full: dist.all_reduce(full),
            "allgather": lambda full=full, part=part: dist.all_gather_into_tensor(full, part),
            "reduce_scatter": lambda full=full, part=part: dist.reduce_scatter_tensor(part, full),
        }
        for kind, fn in ops.items():
            s = _cuda_time(fn)
            algo = 2.0 if kind == "allreduce" else 1.0
            busbw = algo * nbytes * (world - 1) / world / s / 1e9
            out[kind].append({"ranks": world, "bytes": nbytes, "busbw_gbps": round(busbw, 1)})
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="where the JSON table goes")
    p.add_argument(
        "--trace-config", action="append", default=[], help="gigatron train flags of a model whose "
        "GEMM / attention shapes to measure too (repeatable)",
    )  # fmt: skip
    a = p.parse_args(argv)
    gemms, attn = traced_shapes(a.trace_config)  # fake process groups: before the real one
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    gemms |= {(m, n, k, "nn") for m, n, k in itertools.product(GRID, GRID, GRID)}
    attn |= {(8192 // s, 16, s, d) for s in (1024, 2048, 4096, 8192) for d in (64, 128)}
    table = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "bash bench/run.sh calibrate",
        "dtype": "bfloat16",
        "gemm": gemm_rows(gemms),
        "attention": attention_rows(attn),
        "memory_gbps": memory_gbps(),
        "op_overhead_us": op_overhead_us(),
    }
    if world > 1:
        table["collectives"] = collective_rows()
    if int(os.environ.get("RANK", "0")) == 0:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(table, f, indent=1)
        summary = {k: table[k] for k in ("device", "memory_gbps", "op_overhead_us", "torch")}
        summary.update(
            gemms=len(table["gemm"]),
            best_gemm_tflops=max(r["tflops"] for r in table["gemm"]),
            attention=len(table["attention"]),
            out=a.out,
        )
        print("RESULT", json.dumps({"impl": "calibrate", **summary}), flush=True)
    if world > 1:
        dist.destroy_process_group()
    return table


if __name__ == "__main__":
    main()
