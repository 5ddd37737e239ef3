"""`gigatron estimate` against measurement: per-rank peak memory of real CPU training steps.

Seven layouts on two gloo ranks, one spawn: each rank trains two steps under `LiveTensorBytes`
(every tensor byte alive, counted from the model's construction on); the parent estimates the
same ranks on the fake backend from the meta-built model and the activation accounting. The
estimate must land within 10% of the measured peak, and its parameter + gradient bytes within
1% of what the built model and DDP actually hold (with the flat Adam step, which allocates its
state when built, parameter + gradient + optimizer bytes). The kernels CUDA compiles run as one
fused kernel each here too: the chunked cross entropy's helpers keep only their outputs, the
flat Adam update writes in place (eager on CPU they would add fp32 temporaries no GPU has).
"""

from __future__ import annotations

import contextlib

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
    # pretrain_gpt's GPU recipe (bench/run.sh train_one): bf16 with fp32 main params and grads,
    # the distributed optimizer's flat Adam step (CUDA's default), the fused cross entropy
    "bf16-distopt-flat": "--bf16 --use-distributed-optimizer --accumulate-allreduce-grads-in-fp32 "
    "--cross-entropy-loss-fusion --flat-adam-step --clip-grad 1.0 --weight-decay 0.1",
}


pytestmark = pytest.mark.multirank


@contextlib.contextmanager
def _cuda_kernels():
    """The chunked cross entropy's helpers and the flat Adam update as the single kernels CUDA
    compiles them into: outputs only, and an in-place update that allocates nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    from gigatron.core.fusions import chunked_cross_entropy as ce
    from gigatron.core.optimizer import _flat_adam_step as flat
    from tests.tools.test_estimate import _fused_stand_ins

    def in_place(device):
        def update(*args):
            with _disable_current_modes():
                flat.flat_adam_update(*args)

        return update

    helpers, update_fn = ce._HELPERS["eager"], flat._update_fn
    ce._HELPERS["eager"], flat._update_fn = _fused_stand_ins(helpers, None), in_place
    try:
        yield
    finally:
        ce._HELPERS["eager"], flat._update_fn = helpers, update_fn


def _measure_all(layouts: dict[str, list[str]]) -> dict:
    with _cuda_kernels():
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
            if "--flat-adam-step" in argv:  # its main params, moments and group ids: built
                static += est["optimizer_bytes"]
            assert abs(static / got["static_bytes"] - 1) < 0.01, (name, rank, est, got)
