"""Megatron-FSDP training checkpoints (`--ckpt-format fsdp_dtensor`, written by the same atomic
DCP save as torch_dist): saved under optim_grads_params at DP 4, they resume exactly at DP 4,
and load at TP 2 x DP 2 (FSDP `optim`) and under DDP + the distributed optimizer at DP 4 with
every full tensor (weights and Adam moments) bitwise equal after re-saving and the next two
steps within 1e-6 of the run that never stopped. Llama style (SwiGLU: GLU fc1's row-block
factory cut by the FSDP shard; RMSNorm, RoPE), fp32 on CPU, one spawn of 4 ranks."""

import argparse

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gigatron.core import dist_checkpointing as dc
from gigatron.core import parallel_state as ps
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    FullyShardedDataParallel,
    finalize_model_grads,
)
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt

pytestmark = pytest.mark.multirank

V, S, GLOBAL_B = 64, 8, 4


def _build(tp, strategy):
    """strategy: a Megatron-FSDP sharding strategy, or None for DDP + distributed optimizer."""
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, tensor_model_parallel_size=tp, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(), V, S, position_embedding_type="rope")
    if strategy is None:
        ddp_cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
        wrapped = DistributedDataParallel(cfg, ddp_cfg, model)
    else:
        ddp_cfg = DistributedDataParallelConfig(
            use_megatron_fsdp=True,
            use_distributed_optimizer=True,
            data_parallel_sharding_strategy=strategy,
        )
        wrapped = FullyShardedDataParallel(cfg, ddp_cfg, model)
    opt_cfg = OptimizerConfig(lr=1e-2, use_distributed_optimizer=True, clip_grad=1.0)
    return wrapped, get_megatron_optimizer(opt_cfg, [wrapped])


def _step(model, opt, step):
    """One step on global batch `step` split over DP; returns the global loss."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    labels = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = slice(dp_rank * GLOBAL_B // dp, (dp_rank + 1) * GLOBAL_B // dp)
    model.zero_grad_buffer()
    opt.zero_grad()
    loss = model(ids[mine], None, None, labels=labels[mine]).mean()
    loss.backward()
    finalize_model_grads([model])
    assert opt.step()[0]
    total = loss.detach().clone()
    dist.all_reduce(total, group=ps.get_data_parallel_group())
    return (total / dp).item()


def _args(save, load):
    return argparse.Namespace(
        save=save, load=load, consumed_train_samples=0, ckpt_format="fsdp_dtensor"
    )


def _full(ckpt_dir):
    return dc.load_plain_tensors(f"{ckpt_dir}/iter_0000002")


def _body(root):
    src = f"{root}/fsdp_dp4"
    model, opt = _build(1, "optim_grads_params")
    for step in range(2):
        _step(model, opt, step)
    ckpt.save_checkpoint(2, [model], opt, None, args=_args(src, src))
    ref = [_step(model, opt, step) for step in (2, 3)]
    ps.destroy_model_parallel()
    results = {}
    for name, tp, strategy in (
        ("fsdp_dp4", 1, "optim_grads_params"),
        ("fsdp_tp2dp2", 2, "optim"),
        ("ddp_dp4", 1, None),
    ):
        dst = f"{root}/again_{name}"
        model, opt = _build(tp, strategy)
        it, _ = ckpt.load_checkpoint([model], opt, None, args=_args(dst, src))
        assert it == 2
        ckpt.save_checkpoint(2, [model], opt, None, args=_args(dst, src))
        results[name] = [_step(model, opt, step) for step in (2, 3)]
        ps.destroy_model_parallel()
    return ref, results


def test_fsdp_checkpoint_resumes_and_reshards_to_dp2_and_ddp(tmp_path):
    ref, results = run_distributed(_body, 4, args=(str(tmp_path),), timeout=240)[0]
    source = _full(tmp_path / "fsdp_dp4")
    assert source["decoder.layers.mlp.linear_fc1.weight"].shape == (2, 2 * 48, 32)
    assert "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight" in source
    assert results["fsdp_dp4"] == ref  # same layout: exact resume
    for name, losses in results.items():
        again = _full(tmp_path / f"again_{name}")
        assert sorted(again) == sorted(source), name
        for key in source:
            assert torch.equal(again[key], source[key]), (name, key)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=0, atol=1e-6)
