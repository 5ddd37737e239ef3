"""OptimizerConfig.flat_adam_step=True (core/optimizer/_flat_adam_step.py) through the
training checkpoint (gigatron.training.checkpointing -> dist_checkpointing's reshardable
optimizer state): a bf16 GPTModel + distributed optimizer trained with the flat step at DP = 2,
saved, loaded into a fresh flat optimizer at DP = 2 and at DP = 1: the re-saved checkpoint holds
the same tensors bitwise (fp32 main params, Adam moments), and the next steps continue the run
(bitwise at the same layout). A torch-step optimizer loads the flat run's checkpoint too."""

import argparse

import pytest
import torch
import torch.distributed as dist

from gigatron.core import dist_checkpointing as dc
from gigatron.core import parallel_state as ps
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt

pytestmark = pytest.mark.multirank


V, S, GLOBAL_B = 32, 8, 4


def _build(flat: bool):
    ps.initialize_model_parallel()
    torch.manual_seed(0)
    cfg = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bf16=True, params_dtype=torch.bfloat16,
    )  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(), V, S).to(torch.bfloat16)
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, bucket_size=1000
    )
    ddp = DistributedDataParallel(cfg, ddp_config, model)
    opt = get_megatron_optimizer(
        OptimizerConfig(
            lr=1e-2,
            weight_decay=0.1,
            clip_grad=1.0,
            bf16=True,
            params_dtype=torch.bfloat16,
            use_distributed_optimizer=True,
            flat_adam_step=flat,
        ),  # fmt: skip
        [ddp],
    )
    assert (opt._flat_step is not None) == flat
    return ddp, opt


def _step(ddp, opt, step):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    labels = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = slice(dp_rank * GLOBAL_B // dp, (dp_rank + 1) * GLOBAL_B // dp)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    loss = ddp(ids[mine], None, None, labels=labels[mine]).float().mean()
    loss.backward()
    ddp.finish_grad_sync()
    assert opt.step()[0]
    total = loss.detach().clone()
    dist.all_reduce(total, group=ps.get_data_parallel_group())
    return (total / dp).item()


def _args(save, load):
    return argparse.Namespace(save=save, load=load, consumed_train_samples=0)


def _train_save_continue(save_dir):
    ddp, opt = _build(True)
    for step in range(2):
        _step(ddp, opt, step)
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(save_dir, save_dir))
    return [_step(ddp, opt, step) for step in (2, 3)]


def _load_resave_continue(load_dir, resave_dir, flat):
    ddp, opt = _build(flat)
    it, _ = ckpt.load_checkpoint([ddp], opt, None, args=_args(resave_dir, load_dir))
    assert it == 2
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(resave_dir, load_dir))
    return [_step(ddp, opt, step) for step in (2, 3)]


def test_flat_step_training_checkpoint_round_trip_and_reshard(tmp_path):
    src = str(tmp_path / "dp2")
    ref_losses = run_distributed(_train_save_continue, 2, args=(src,), timeout=180)[0]
    source = dc.load_plain_tensors(f"{src}/iter_0000002")
    assert any(".exp_avg_sq." in k for k in source) and any(".fp32_param." in k for k in source)
    for name, world, flat in (("dp2", 2, True), ("dp1", 1, True), ("dp2_torch", 2, False)):
        dst = str(tmp_path / f"re_{name}")
        losses = run_distributed(_load_resave_continue, world, args=(src, dst, flat), timeout=180)[
            0
        ]
        again = dc.load_plain_tensors(f"{dst}/iter_0000002")
        assert sorted(again) == sorted(source), name
        for key in source:
            assert torch.equal(again[key], source[key]), (name, key)
        if name == "dp2":  # same layout, new process group: exact resume
            assert losses == ref_losses, (losses, ref_losses)
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=1e-4, msg=name
        )
