"""The gigatron-only step switches are config fields and training flags, not environment
variables: `--flat-adam-step` / `--no-flat-adam-step` -> `OptimizerConfig.flat_adam_step`,
`--sync-free-step` -> `OptimizerConfig.sync_free_step`, `--no-wgrad-gemm-accum-fp32` ->
`ModelParallelConfig.wgrad_gemm_accum_fp32`; each reaches the code it controls, the retired
variables (GIGATRON_FLAT_OPTIMIZER_STEP, GIGATRON_SYNC_FREE_STEP, GIGATRON_WGRAD_FP32_GEMM) change
nothing, and `gigatron/core` reads no environment variable but the process-launch ones."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.tensor_parallel import wgrad
from gigatron.core.tensor_parallel.layers import _mark_wgrad_fusion
from gigatron.training._config_from_args import (
    core_transformer_config_from_args,
    optimizer_config_from_args,
)
from gigatron.training.arguments import parse_args, validate_args
from tests._paths import REPO

BASE = (
    "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
    "--micro-batch-size 1 --global-batch-size 4 --train-iters 10 --lr 1e-3 --mock-data"
).split()
RETIRED = ("GIGATRON_FLAT_OPTIMIZER_STEP", "GIGATRON_SYNC_FREE_STEP", "GIGATRON_WGRAD_FP32_GEMM")
# torchrun's variables, and srun's rank and task count (rank discovery, as Megatron's _rank_utils)
LAUNCH = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
}


def _args(*extra):
    return validate_args(parse_args(argv=BASE + list(extra)), world_size=1)


@pytest.mark.parametrize(
    "flags, flat, sync_free, wgrad_fp32",
    [
        ((), None, False, True),
        (("--flat-adam-step",), True, False, True),
        (("--no-flat-adam-step", "--sync-free-step"), False, True, True),
        (("--no-wgrad-gemm-accum-fp32",), None, False, False),
    ],
)
def test_flags_reach_the_configs(flags, flat, sync_free, wgrad_fp32):
    args = _args(*flags)
    opt_config = optimizer_config_from_args(args)
    assert (opt_config.flat_adam_step, opt_config.sync_free_step) == (flat, sync_free)
    assert core_transformer_config_from_args(args).wgrad_gemm_accum_fp32 is wgrad_fp32


def test_sync_free_step_builds_the_fused_adam_on_any_device(monkeypatch):
    """The sync-free step needs torch's fused kernel (its grad_scale / found_inf inputs): the
    field asks for it on CPU too; the retired variable does not."""
    for name in RETIRED:
        monkeypatch.setenv(name, "1")

    def fused(sync_free: bool) -> bool:
        model = torch.nn.Linear(4, 4)
        config = OptimizerConfig(lr=1e-3, sync_free_step=sync_free)
        return bool(get_megatron_optimizer(config, [model]).optimizer.defaults.get("fused"))

    assert fused(True) and not fused(False)


@pytest.mark.parametrize("fp32_gemm", [True, False])
def test_wgrad_field_reaches_the_gemm_choice(monkeypatch, fp32_gemm):
    """The layer copies `wgrad_gemm_accum_fp32` onto its weight; the backward asks for the
    fp32-accumulating GEMM only when it is True (the variable is not read)."""
    monkeypatch.setenv("GIGATRON_WGRAD_FP32_GEMM", "0" if fp32_gemm else "1")
    asked = []
    monkeypatch.setattr(wgrad, "_addmm_fp32_accumulate", lambda *a: asked.append(1) or False)
    weight = torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.bfloat16))
    config = ModelParallelConfig(gradient_accumulation_fusion=True, wgrad_gemm_accum_fp32=fp32_gemm)
    _mark_wgrad_fusion(weight, config)
    weight.main_grad = torch.zeros(3, 2, dtype=torch.float32)
    dy, x = torch.ones(5, 3, dtype=torch.bfloat16), torch.ones(5, 2, dtype=torch.bfloat16)
    ctx = SimpleNamespace(gradient_accumulation_fusion=True)
    assert wgrad.weight_grad(ctx, weight, dy, x) is None  # no DDP flag: dW is in main_grad
    assert bool(asked) is fp32_gemm
    torch.testing.assert_close(weight.main_grad, torch.full((3, 2), 5.0))


def test_core_reads_only_process_launch_variables():
    core = REPO / "gigatron" / "core"
    reads = re.compile(r"os\.(?:environ|getenv)")
    for path in core.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not reads.search(line):
                continue
            names = set(re.findall(r"[\"']([A-Z_][A-Z0-9_]*)[\"']", line))
            assert names and names <= LAUNCH, f"{path.relative_to(core)}:{number}: {line.strip()}"
