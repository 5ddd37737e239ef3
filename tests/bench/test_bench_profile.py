"""bench/_lib/profiling.py's communication split (hidden under compute vs exposed) and the
one-step kernel trace, on hand-made kernel spans (no GPU needed), plus bench_gpt's check of
the --async-tp switch."""

import gzip
import json

import pytest

from bench._lib import args as _bench_args
from bench._lib import profiling as bp


def test_comm_split_into_hidden_and_exposed():
    # One step, times in µs: a GEMM 0-100 and an attention kernel 150-200 on the compute
    # stream; NCCL 50-170 (hidden 50-100 and 150-170, exposed 100-150) and 300-320 (exposed).
    spans = [
        (0.0, 100.0, "nvjet_gemm"),
        (150.0, 200.0, "cudnn_sdpa_fprop"),
        (50.0, 170.0, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
        (300.0, 320.0, "ncclDevKernel_AllGather_RING_LL"),
    ]
    got = bp._comm_overlap(spans, n=1)
    assert got == {"comm_ms": 0.14, "hidden_ms": 0.07, "exposed_ms": 0.07, "compute_busy_ms": 0.15}
    # Two steps of the same pattern: per-step figures unchanged.
    shifted = [(s + 1000.0, e + 1000.0, k) for s, e, k in spans]
    assert bp._comm_overlap(spans + shifted, n=2) == got


def test_union_and_intersection_of_spans():
    assert bp._union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert bp._intersection([(0, 3), (5, 8)], [(2, 6), (7, 10)]) == 3  # 2-3, 5-6, 7-8


def test_trace_keeps_the_last_step(tmp_path):
    spans = [(float(t), float(t) + 5.0, f"k{t}") for t in (0, 10, 100, 110)]
    path = tmp_path / "trace.json.gz"
    bp._write_trace(spans, str(path), n=2)
    with gzip.open(path, "rt") as f:
        assert json.load(f) == [[0.0, 5.0, "k100"], [10.0, 5.0, "k110"]]


def test_async_tp_switch_needs_tp_sp_compile_and_cuda():
    with pytest.raises(ValueError, match="--async-tp needs --tp > 1, --sp"):
        _bench_args.parse_args(["--config", "tiny", "--device", "cpu", "--async-tp"])
    with pytest.raises(ValueError, match="--async-tp needs"):
        _bench_args.parse_args(["--tp", "2", "--sp", "--compile", "none", "--async-tp"])
