"""Megatron's backend-only flags (example recipes pass them) are accepted and each prints one
line naming what runs instead; --moe-token-dispatcher-type flex runs the alltoall dispatcher;
--logging-level sets the root logger's level; --moe-router-force-load-balancing routes on
random logits with a straight-through gradient."""

from __future__ import annotations

import logging

import pytest
import torch

from gigatron.training.arguments import parse_args, validate_args

BASE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
        "--mock-data", "--vocab-size", "64"]  # fmt: skip
MOE = ["--num-experts", "4", "--expert-model-parallel-size", "1"]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--use-nccl-ub"], "--use-nccl-ub: gradients and parameters"),
        (["--fsdp-manual-registration"], "--fsdp-manual-registration: no Megatron-FSDP"),
        (["--enable-experimental"], "--enable-experimental: gigatron has no experimental"),
        (["--export-force-local-attention"], "--export-force-local-attention: a ModelOpt"),
        (["--enable-gpt-oss"], "--enable-gpt-oss: a ModelOpt export switch"),
        (["--disable-bf16-reduced-precision-matmul"], "no effect without --bf16"),
        (
            [
                *MOE,
                "--moe-token-dispatcher-type",
                "flex",
                "--moe-flex-dispatcher-backend",
                "hybridep",
            ],
            "gigatron's alltoall dispatcher runs",
        ),  # fmt: skip
    ],
)
def test_backend_flag_prints_one_line_and_builds_the_configs(capsys, flags, says):
    from gigatron.training._config_from_args import (
        core_transformer_config_from_args,
        ddp_config_from_args,
    )

    args = parse_args(argv=BASE + flags)
    validate_args(args, 1)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gigatron: ")]
    assert len(lines) == 1 and says in lines[0], lines
    ddp_config_from_args(args)  # the DDP and model configs take the run (nothing refused)
    config = core_transformer_config_from_args(args)
    if "flex" in flags:
        assert config.moe_token_dispatcher_type == "alltoall"


def test_logging_level_sets_the_root_logger(monkeypatch):
    from gigatron.training import initialize

    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # restored after the test
    monkeypatch.delenv("MEGATRON_LOGGING_LEVEL", raising=False)
    args = parse_args(argv=BASE + ["--logging-level", "40"])
    initialize._set_logging_level(args)
    assert root.level == 40
    monkeypatch.setenv("MEGATRON_LOGGING_LEVEL", "30")
    initialize._set_logging_level(parse_args(argv=BASE))
    assert root.level == 30


def test_force_load_balancing_routes_on_random_logits_with_straight_through_grad():
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from gigatron.core.transformer.moe.moe_utils import apply_random_logits

    model_parallel_cuda_manual_seed(7)
    logits = torch.full((64, 8), 5.0, requires_grad=True)
    random = apply_random_logits(logits)
    assert abs(random.mean().item()) < 0.3 and 0.7 < random.std().item() < 1.3
    random.backward(torch.arange(64 * 8.0).view(64, 8))
    torch.testing.assert_close(logits.grad, torch.arange(64 * 8.0).view(64, 8))
    model_parallel_cuda_manual_seed(7)  # the expert-parallel stream: same seed, same logits
    torch.testing.assert_close(apply_random_logits(logits.detach()), random.detach())


def test_force_load_balancing_needs_experts():
    args = parse_args(argv=BASE + ["--moe-router-force-load-balancing"])
    with pytest.raises(ValueError, match="--moe-router-force-load-balancing needs --num-experts"):
        validate_args(args, 1)
