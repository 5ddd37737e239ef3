"""The Megatron optimizer on CUDA under an NCCL group: grad clipping, zero counting and fp16
loss scaling keep their statistics on the GPU (NCCL reduces CUDA tensors only).

One NCCL rank (file rendezvous); the same step on CPU/gloo is the reference elsewhere
(tests/core/optimizer/test_clip_grads.py, test_optimizer_fp16.py).
"""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture
def nccl_group():
    from gigatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():  # a stale group another test left behind (gloo, one rank)
        dist.destroy_process_group()
    dist.init_process_group("nccl", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_optimizer_step_with_clipping_on_cuda(nccl_group, precision):
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                            **{precision: True}, params_dtype=dtype)  # fmt: skip
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    net = net.cuda().to(dtype)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), net)
    opt_cfg = OptimizerConfig(lr=1e-3, clip_grad=1e-3, log_num_zeros_in_grad=True,
                              **{precision: True}, initial_loss_scale=1024.0)  # fmt: skip
    opt = get_megatron_optimizer(opt_cfg, [ddp])
    before = [p.detach().float().clone() for p in net.parameters()]
    loss = net(torch.randn(8, 32, device="cuda", dtype=dtype)).float().pow(2).mean()
    opt.scale_loss(loss).backward()
    ddp.finish_grad_sync()
    ok, grad_norm, zeros = opt.step()
    assert ok and grad_norm is not None and grad_norm > 1e-3  # clipped: norm above clip_grad
    assert zeros is not None
    moved = [(p.detach().float() - b).abs().max().item() for p, b in zip(net.parameters(), before)]
    assert max(moved) > 0


@pytest.mark.parametrize("layout", ["plain", "distributed", "flat"])
def test_sync_free_step_makes_no_host_sync(nccl_group, layout):
    """The sync-free step() on CUDA (OptimizerConfig.sync_free_step; fused AdamW, bf16, fp32
    grads; the distributed optimizer; its flat step, flat_adam_step=True): not one host sync
    (torch's sync debug mode raises on any), a NaN grad skips the update, and the norm equals
    the host one."""
    distributed = layout != "plain"
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, bf16=True,
                            params_dtype=torch.bfloat16)  # fmt: skip
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    net = net.cuda().to(torch.bfloat16)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed
    )
    ddp = DistributedDataParallel(cfg, ddp_cfg, net)
    opt_cfg = OptimizerConfig(lr=1e-3, clip_grad=1e-3, bf16=True, params_dtype=torch.bfloat16,
                              use_distributed_optimizer=distributed,
                              flat_adam_step=layout == "flat", sync_free_step=True)  # fmt: skip
    opt = get_megatron_optimizer(opt_cfg, [ddp])
    for step in range(3):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        net(torch.randn(8, 32, device="cuda", dtype=torch.bfloat16)).float().pow(
            2
        ).mean().backward()
        ddp.finish_grad_sync()
        if step == 2:
            next(net.parameters()).main_grad.view(-1)[0] = float("nan")
        before = [p.detach().clone() for p in net.parameters()]
        torch.cuda.synchronize()
        # the flat step compiles its pass at the first step (compiling may sync): checked after
        torch.cuda.set_sync_debug_mode("error" if step > 0 or layout != "flat" else "default")
        try:
            ok, norm, _ = opt.step()
            nonfinite = ~ok
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if step < 2:
            assert not bool(nonfinite) and float(norm) > 1e-3
        else:
            assert bool(nonfinite) and all(
                torch.equal(p, b) for p, b in zip(net.parameters(), before)
            )


def _distributed_run(precision: str, steps: int = 3, flat_adam_step: bool | None = None):
    """A bf16 / fp16 model under the distributed optimizer (fp32 grad buffers): its optimizer and
    the params after `steps` clipped steps."""
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                            **{precision: True}, params_dtype=dtype)  # fmt: skip
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    net = net.cuda().to(dtype)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=True
    )
    ddp = DistributedDataParallel(cfg, ddp_cfg, net)
    opt_cfg = OptimizerConfig(lr=1e-3, clip_grad=1e-2, weight_decay=0.1, **{precision: True},
                              params_dtype=dtype, use_distributed_optimizer=True,
                              flat_adam_step=flat_adam_step)  # fmt: skip
    opt = get_megatron_optimizer(opt_cfg, [ddp])
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(steps):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        x = torch.randn(8, 32, device="cuda", generator=gen).to(dtype)
        opt.scale_loss(net(x).float().pow(2).mean()).backward()
        ddp.finish_grad_sync()
        assert opt.step()[0]
    return opt, [p.detach().float().clone() for p in net.parameters()]


def test_flat_step_is_the_default_on_cuda(nccl_group):
    """flat_adam_step=None (the default): a bf16 distributed optimizer on CUDA takes the flat
    step, with the torch step's results (False) up to fp32 rounding; fp16 (a loss scaler) keeps
    the torch step."""
    flat_opt, flat_params = _distributed_run("bf16")
    assert flat_opt._flat_step is not None
    fp16_opt, _ = _distributed_run("fp16", steps=0)  # its first steps skip (loss-scale search)
    assert fp16_opt._flat_step is None
    torch_opt, torch_params = _distributed_run("bf16", flat_adam_step=False)
    assert torch_opt._flat_step is None
    for got, want in zip(flat_params, torch_params, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-2)  # bf16 params: one ulp
    flat_main = [m.detach() for g in flat_opt.optimizer.param_groups for m in g["params"]]
    torch_main = [m.detach() for g in torch_opt.optimizer.param_groups for m in g["params"]]
    for got, want in zip(flat_main, torch_main, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
