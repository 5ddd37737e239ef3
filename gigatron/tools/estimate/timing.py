"""Step time of a rank from its traced work (`trace.py`) and a measured calibration table.

The table (`bench/estimate/calibrate.py` writes it; `calibration/h200.json` once measured) holds

    gemm         [{m, n, k, layout, tflops}]  bf16 GEMMs: a grid of shapes, plus the shapes and
                 operand layouts ("nt": B read transposed) of traced models
    attention    [{b, heads, seq, head_dim, fwd_tflops, bwd_tflops}]  causal flash SDPA
    memory_gbps  a large device copy's (read + write) bytes per second / 1e9
    op_overhead_us  host time of one small eager op (launch + dispatch)
    collectives  {kind: [{ranks, bytes, busbw_gbps}]}  present when measured on several GPUs

A GEMM takes the throughput of the calibrated shape nearest in log space (among rows of its
operand layout when there are any); an attention call the
nearest calibrated attention; every other op its bytes over `memory_gbps`, and at least
`op_overhead_us` of host time (an eager step cannot run faster than Python launches it).
Collectives take (bytes x algorithm factor) / bus bandwidth of the nearest calibrated size;
without collective rows they are reported as volume only and priced at zero (said so in the
output). The step: microbatches x (forward + backward of every chunk) + the pipeline bubble
((pp - 1) / chunks of one microbatch's time) + the optimizer's pass over its parameters + DDP's
grad buffer passes (zeroed every step, read by the gradient norm over the optimizer's shard).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gigatron.core.untrusted_files import read_text
from gigatron.tools.estimate.trace import Trace

CALIBRATION_DIR = Path(__file__).parent / "calibration"

# bytes a rank sends per byte of the collective's buffer, times size/(size-1) folded into busbw
_ALGO = {"allreduce": 2.0, "allgather": 1.0, "reduce_scatter": 1.0, "alltoall": 1.0}


def load_calibration(path: str | None) -> dict | None:
    """The table at `path` (a file, or a name under `calibration/`), or None."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        p = CALIBRATION_DIR / (path if path.endswith(".json") else f"{path}.json")
    if not p.exists():
        raise FileNotFoundError(
            f"--calibration {path}: no such file (bench/estimate/calibrate.py makes one)"
        )
    text = read_text(p, what="--calibration", max_bytes="calibration")  # regular files only
    try:
        table = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--calibration {p}: not JSON ({e})") from None
    if not isinstance(table, dict):
        raise ValueError(f"--calibration {p}: a JSON object expected, got {type(table).__name__}")
    for key in ("gemm", "attention", "memory_gbps", "op_overhead_us"):
        if key not in table:
            raise ValueError(
                f"--calibration {p}: no {key!r} entry (bench/estimate/calibrate.py writes it)"
            )
    return table


def _nearest(rows: list[dict], keys: tuple[str, ...], values: tuple[float, ...]) -> dict:
    def dist(row):
        return sum((math.log(row[k]) - math.log(max(v, 1))) ** 2 for k, v in zip(keys, values))

    return min(rows, key=dist)


def gemm_seconds(table: dict, m: int, n: int, k: int, batch: int, layout: str = "nn") -> float:
    rows = [r for r in table["gemm"] if r.get("layout", "nn") == layout] or table["gemm"]
    row = _nearest(rows, ("m", "n", "k"), (m * batch, n, k))
    return 2.0 * m * n * k * batch / (row["tflops"] * 1e12)


def attention_seconds(table: dict, call: tuple) -> float:
    b, h, sq, skv, d, causal, kind = call
    row = _nearest(table["attention"], ("b", "heads", "seq", "head_dim"), (b, h, sq, d))
    flops = 4.0 * b * h * sq * skv * d * (2 if kind == "backward" else 1) / (2 if causal else 1)
    return flops / (row["bwd_tflops" if kind == "backward" else "fwd_tflops"] * 1e12)


def collective_seconds(table: dict, kind: str, nbytes: int, size: int) -> float | None:
    rows = table.get("collectives", {}).get(kind)
    if size <= 1:
        return 0.0
    if not rows:
        return None
    row = _nearest(rows, ("bytes",), (nbytes,))
    return _ALGO.get(kind, 1.0) * nbytes * (size - 1) / size / (row["busbw_gbps"] * 1e9)


def trace_seconds(table: dict, tr: Trace) -> dict:
    """Device seconds of one traced microbatch, by part; `host_s` the eager launch floor."""
    gemm = sum(gemm_seconds(table, m, n, k, b, layout) for m, n, k, b, layout in tr.gemms)
    attn = sum(attention_seconds(table, call) for call in tr.attention)
    other = tr.other_bytes / (table["memory_gbps"] * 1e9)
    comm, uncalibrated = 0.0, 0
    for kind, nbytes, size, _ in tr.collectives:
        s = collective_seconds(table, kind, nbytes, size)
        if s is None:
            uncalibrated += 1
        else:
            comm += s
    num_ops = len(tr.gemms) + 2 * len(tr.attention) + tr.other_ops + len(tr.collectives)
    host = num_ops * table["op_overhead_us"] * 1e-6
    return {
        "gemm_s": gemm,
        "attention_s": attn,
        "other_s": other,
        "comm_s": comm,
        "uncalibrated_collectives": uncalibrated,
        "host_s": host,
        "device_s": gemm + attn + other + comm,
    }


def optimizer_seconds(table: dict, num_params: int, bytes_per_param: int) -> float:
    """The update reads and writes each parameter's state once: memory-bound."""
    return num_params * bytes_per_param / (table["memory_gbps"] * 1e9)


def step_seconds(
    table: dict,
    per_chunk: list[Trace],
    *,
    num_microbatches: int,
    pp_size: int,
    num_params: int,
    optimizer_bytes_per_param: int,
    grad_buffer_bytes: float = 0.0,
) -> dict:
    """The rank's step: every microbatch through every chunk, bubble, optimizer, and DDP's grad
    buffer passes outside them (`grad_buffer_bytes`: zeroed, read by the norm) (module doc)."""
    parts = [trace_seconds(table, tr) for tr in per_chunk]
    per_mb = sum(max(p["device_s"], p["host_s"]) for p in parts)
    bubble = (pp_size - 1) / len(per_chunk) * per_mb if pp_size > 1 else 0.0
    opt = optimizer_seconds(table, num_params, optimizer_bytes_per_param)
    grad_buffer = grad_buffer_bytes / (table["memory_gbps"] * 1e9)
    total = num_microbatches * per_mb + bubble + opt + grad_buffer
    merged = {k: sum(p[k] for p in parts) * num_microbatches for k in parts[0]}
    merged.update(bubble_s=bubble, optimizer_s=opt, grad_buffer_s=grad_buffer, step_s=total)
    return merged
