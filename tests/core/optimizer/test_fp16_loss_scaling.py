"""fp16 with dynamic loss scaling: an inf in ONE rank's grad makes EVERY rank skip the step,
leaves weights and optimizer state untouched and backs the scale off; clean steps go on.

Plain optimizer: the inf enters rank 1's local grad before the DP all-reduce, which spreads it.
Distributed optimizer: the inf is put in the half of rank 1's grad buffer that rank 0 owns, so
after the reduce-scatter only rank 0 sees it and the found-inf flag must be max-reduced over
all ranks for rank 1 to skip too.
"""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _fp16_body(dist_opt: bool):
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model = model.half()
    ddp = DistributedDataParallel(
        ModelParallelConfig(),
        DistributedDataParallelConfig(use_distributed_optimizer=dist_opt),
        model,
    )
    config = OptimizerConfig(
        lr=1e-2,
        fp16=True,
        params_dtype=torch.float16,
        initial_loss_scale=1024.0,
        hysteresis=1,
        use_distributed_optimizer=dist_opt,
    )
    opt = get_megatron_optimizer(config, [ddp])
    torch.manual_seed(1 + rank)
    log = []
    for step in range(3):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        x, y = torch.randn(4, 8).half(), torch.randn(4, 4)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.scale_loss(loss).backward()
        if step == 1 and rank == 1:
            (buffer,) = ddp.buffers
            # Rank 0 owns the first half of the (single) bucket under the distributed optimizer.
            buffer.grad_data[0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        state_steps = [s["step"].item() for s in opt.optimizer.state.values() if "step" in s]
        finalize_model_grads([ddp])
        ok, norm, zeros = opt.step()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        steps_after = [s["step"].item() for s in opt.optimizer.state.values() if "step" in s]
        log.append(
            {
                "ok": ok,
                "norm": norm,
                "zeros": zeros,
                "changed": changed,
                "scale": opt.get_loss_scale().item(),
                "adam_steps_before": state_steps,
                "adam_steps_after": steps_after,
            }
        )
    return log


def _both():
    ps.initialize_model_parallel()
    return {d: _fp16_body(d) for d in (False, True)}


def test_fp16_overflow_skips_on_all_ranks():
    per_rank = run_distributed(_both, 2)
    for rank, by_mode in enumerate(per_rank):
        for dist_opt, log in by_mode.items():
            tag = f"rank {rank} distributed_optimizer={dist_opt}"
            first, overflow, last = log
            assert first["ok"] and first["changed"] and first["scale"] == 1024.0, tag
            assert first["norm"] > 0.0, tag
            # Overflow: skipped everywhere, nothing moved, scale halved (hysteresis=1).
            assert overflow["ok"] is False and overflow["norm"] is None, tag
            assert overflow["zeros"] is None, tag
            assert not overflow["changed"], tag
            assert overflow["scale"] == 512.0, tag
            assert overflow["adam_steps_after"] == overflow["adam_steps_before"], tag
            # Training resumes at the lower scale.
            assert last["ok"] and last["changed"] and last["scale"] == 512.0, tag
