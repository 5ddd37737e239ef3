"""The Megatron optimizer on CUDA under an NCCL group: grad clipping, zero counting and fp16
loss scaling keep their statistics on the GPU (NCCL reduces CUDA tensors only).

One NCCL rank (file rendezvous); the same step on CPU/gloo is the reference elsewhere
(tests/dist/test_optimizer_clip.py, test_optimizer_fp16.py).
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
