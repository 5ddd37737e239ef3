"""TP = 2 sequence-parallel communication beside a GEMM: NCCL vs copy-engine collectives.

    torchrun --nproc-per-node 2 bench/parallel/bench_tp_comm.py [--check-only | --nccl-only]

First checks `gigatron::ce_all_gather` / `ce_reduce_scatter` (gigatron/core/tensor_parallel/
_ce_collectives.py) against NCCL bitwise, eager and under torch.compile (exit code 1 on a
mismatch). Then times, with CUDA events (mean of 20 after 5 warm-up), the gpt-1.3b TP = 2 + SP
shapes: the fc1 GEMM alone, each collective alone, and the GEMM with each collective running
beside it on another stream (what an overlapped layer does). Prints one `RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench._lib.timing import cuda_ms  # noqa: E402
from gigatron.core.tensor_parallel import _ce_collectives  # noqa: E402,F401
from gigatron.core.tensor_parallel._collectives import (  # noqa: E402  (NCCL here)
    _gathered_dim0 as nccl_ag,
)
from gigatron.core.tensor_parallel._collectives import (
    _reduce_scattered_dim0 as nccl_rs,
)

WAIT = torch.ops._c10d_functional.wait_tensor


def ce_ag(x, group):
    return WAIT(torch.ops.gigatron.ce_all_gather(x, group.group_name))


def ce_rs(x, group):
    return WAIT(torch.ops.gigatron.ce_reduce_scatter(x, group.group_name))


def check(group) -> list[str]:
    """Copy-engine results vs NCCL's, bitwise; eager, then compiled, then 3 in flight at once."""
    bad = []
    rank = dist.get_rank()
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    for shape in [(8, 3, 16), (1024, 4, 2048), (5, 7)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
        y = torch.randn(
            (2 * shape[0], *shape[1:]), device="cuda", dtype=torch.bfloat16, generator=g
        )
        for name, fn in [("eager", lambda f: f), ("compiled", torch.compile)]:
            if not torch.equal(fn(ce_ag)(x, group), nccl_ag(x, group)):
                bad.append(f"all_gather {shape} {name}")
            if not torch.equal(fn(ce_rs)(y, group), nccl_rs(y, group)):
                bad.append(f"reduce_scatter {shape} {name}")
    xs = [torch.randn(64, 32, device="cuda", generator=g) for _ in range(6)]
    starts = [torch.ops.gigatron.ce_all_gather(x, group.group_name) for x in xs]
    for x, s in zip(xs, starts):
        if not torch.equal(WAIT(s), nccl_ag(x, group)):
            bad.append("six all-gathers in flight")
    return bad


def timed(fn) -> float:
    """Mean milliseconds of `fn()` (CUDA events), the ranks lined up after the warm-up."""
    return cuda_ms(fn, barrier=dist.barrier)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--check-only", action="store_true")
    p.add_argument(
        "--nccl-only",
        action="store_true",
        help="no copy-engine check or timings: NCCL alone and beside the GEMM (for NCCL_* sweeps)",
    )
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    group = dist.group.WORLD
    bad = [] if a.nccl_only else check(group)
    if bad:
        print("MISMATCH", bad, flush=True)
    if a.check_only or bad:
        dist.destroy_process_group()
        sys.exit(1 if bad else 0)

    # gpt-1.3b, TP = 2, SP, micro-batch 4: layer input [s/2, b, h], fc1 [s*b, h] @ [h, 4h/2]
    s, b, h = 2048, 4, 2048
    x = torch.randn(s // 2, b, h, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(s, b, h, device="cuda", dtype=torch.bfloat16)
    a_mat = torch.randn(s * b, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * h, h, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def gemm():
        return a_mat @ w.t()

    def beside(comm, inp):
        def step():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                r = comm(inp, group)
            out = gemm()
            torch.cuda.current_stream().wait_stream(side)
            return out, r

        return step

    res = {"gemm_ms": timed(gemm), "gemm_tflops": None}
    res["gemm_tflops"] = 2 * s * b * h * 2 * h / res["gemm_ms"] / 1e9
    cases = [
        ("nccl_all_gather", nccl_ag, x),
        ("ce_all_gather", ce_ag, x),
        ("nccl_reduce_scatter", nccl_rs, y),
        ("ce_reduce_scatter", ce_rs, y),
    ]
    for name, comm, inp in [c for c in cases if not (a.nccl_only and c[0].startswith("ce"))]:
        res[f"{name}_ms"] = timed(lambda c=comm, i=inp: c(i, group))
        res[f"gemm_with_{name}_ms"] = timed(beside(comm, inp))
    # bytes each rank receives (16 MiB for both at these shapes) per second
    for name in ("nccl_all_gather", "nccl_reduce_scatter"):
        res[f"{name}_gb_s"] = x.numel() * x.element_size() / res[f"{name}_ms"] / 1e6
    res["nccl_env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_DEV"))}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                      for k, v in res.items()}), flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
