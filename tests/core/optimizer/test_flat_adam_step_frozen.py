"""OptimizerConfig.flat_adam_step=True (core/optimizer/_flat_adam_step.py): a param that
sits in DDP's buffers but not in the optimizer (frozen after DDP wrapped the model, so
get_megatron_optimizer leaves it out) keeps its values through the flat step of a bf16 model,
as with the torch step; the other params match the torch step (DP = 2 gloo ranks). Padding
elements keep their values and zero Adam state whatever their grads."""

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
from gigatron.core.optimizer._flat_adam_step import FlatAdamStep, flat_adam_update
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _run(flat: bool, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(
        dtype
    )
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, bucket_size=64
    )
    ddp = DistributedDataParallel(ModelParallelConfig(), ddp_config, model)
    model[0].weight.requires_grad_(False)  # frozen after wrapping: in a buffer, not stepped
    config = OptimizerConfig(
        lr=1e-2,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=True,
        flat_adam_step=flat,
    )
    opt = get_megatron_optimizer(config, [ddp])
    assert (opt._flat_step is not None) == flat
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + torch.distributed.get_rank())
        ddp.zero_grad_buffer()
        opt.zero_grad()
        x, y = torch.randn(4, 8, generator=g).to(dtype), torch.randn(4, 4, generator=g)
        torch.nn.functional.mse_loss(model(x).float(), y).backward()
        finalize_model_grads([ddp])
        assert opt.step()[0]
    return [p.detach().float().clone() for p in model.parameters()]


def _both():
    ps.initialize_model_parallel()
    return {str(d): (_run(False, d), _run(True, d)) for d in (torch.bfloat16, torch.float32)}


def test_frozen_param_in_a_buffer_keeps_its_values():
    for per_rank in run_distributed(_both, 2):
        for key, (ref, flat) in per_rank.items():
            assert ref[0].abs().max() > 0
            torch.testing.assert_close(flat[0], ref[0], rtol=0, atol=0, msg=f"{key} frozen")
            for a, b in zip(flat[1:], ref[1:], strict=True):
                torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6, msg=key)


def test_padding_row_leaves_its_elements_unchanged():
    """Elements of the padding row (FlatAdamStep._table's last row) keep main, exp_avg,
    exp_avg_sq (0) and get the model param bf16(main), whatever their grads."""
    n = 6
    main, grad = torch.randn(n), torch.randn(n)  # padding grads need not be zero
    exp_avg, exp_avg_sq = torch.zeros(n), torch.zeros(n)
    gid = torch.tensor([0, 1, 1, 0, 1, 1], dtype=torch.uint8)
    table = torch.tensor(
        [
            [0.999, 0.1, 0.3, 0.1, 0.999, 0.001, 1e-8, 0.0, 1.0],
            [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        ]
    )
    no_groups = FlatAdamStep.__new__(FlatAdamStep)
    no_groups.opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    no_groups.opt.param_groups.clear()
    assert torch.equal(no_groups._table(torch.device("cpu")), table[1:])
    model = torch.zeros(n, dtype=torch.bfloat16)
    before = main.clone()
    flat_adam_update(main, grad, exp_avg, exp_avg_sq, gid, table, model)
    pad = gid == 1
    assert torch.equal(main[pad], before[pad])
    assert torch.equal(model[pad].float(), before[pad].bfloat16().float())
    assert not exp_avg[pad].any() and not exp_avg_sq[pad].any()
    assert not torch.equal(main[~pad], before[~pad])  # the real group moved
