"""`gigatron estimate` against measurement: per-rank peak memory of real CPU training steps.

Seven layouts on two gloo ranks, one spawn: each rank trains two steps under `LiveTensorBytes`
(every tensor byte alive, counted from the model's construction on); the parent estimates the
same ranks on the fake backend from the meta-built model and the activation accounting. The
estimate must land within 10% of the measured peak, and its parameter + gradient bytes within
1% of what the built model and DDP actually hold.
"""

from __future__ import annotations

import pytest

from gigatron.testing.distributed import run_distributed
from gigatron.tools.estimate.args import estimate_args
from gigatron.tools.estimate.check import measure_training_peak
from gigatron.tools.estimate.memory import rank_memory
from gigatron.tools.estimate.world import build_chunks, fake_rank

BASE = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--max-position-embeddings 64 --micro-batch-size 4 --vocab-size 256 "
    "--hidden-dropout 0 --attention-dropout 0"
).split()

LAYOUTS = {
    "tp2-sp": "--tensor-model-parallel-size 2 --sequence-parallel",
    "pp2": "--pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 8",
    "dp2-distopt": "--use-distributed-optimizer",
    "cp2": "--context-parallel-size 2",
    "ep2": "--num-experts 4 --expert-model-parallel-size 2 --moe-router-topk 2",
    "recompute": "--recompute-granularity full --recompute-method uniform "
    "--recompute-num-layers 1 --swiglu --normalization RMSNorm",
    "recompute-block": "--recompute-granularity full --recompute-method block "
    "--recompute-num-layers 1 --tensor-model-parallel-size 2",
}


pytestmark = pytest.mark.multirank


def _measure_all(layouts: dict[str, list[str]]) -> dict:
    return {name: measure_training_peak(argv) for name, argv in layouts.items()}


def test_estimated_peak_memory_within_10_percent_of_measured():
    layouts = {name: BASE + extra.split() for name, extra in LAYOUTS.items()}
    measured = run_distributed(_measure_all, 2, args=(layouts,))
    for name, argv in layouts.items():
        args = estimate_args([*argv, "--world-size", "2"])
        for rank, per_rank in enumerate(measured):
            got = per_rank[name]
            with fake_rank(args, rank):
                est = rank_memory(args, build_chunks(args))
            ratio = est["peak_bytes"] / got["peak_bytes"]
            assert abs(ratio - 1) < 0.10, (name, rank, est, got)
            static = est["param_bytes"] + est["grad_bytes"]
            assert abs(static / got["static_bytes"] - 1) < 0.01, (name, rank, est, got)
