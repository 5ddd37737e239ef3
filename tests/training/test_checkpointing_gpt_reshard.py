"""GPTModel + DDP + distributed optimizer: a training checkpoint saved at TP2 x DP2 loads at
TP2 x DP2 (new process group), TP1 x DP4, TP4 x DP1 and TP1 x DP1 with every full tensor
(weights and Adam moments) bitwise equal after re-saving; the next two steps match the run that
never changed layout (<= 1e-6), bitwise at the same layout.

Llama style (SwiGLU: the strided fc1 split, GQA, RMSNorm, RoPE, untied output), fp32 on CPU.
"""

import argparse

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

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


V, S, GLOBAL_B = 64, 8, 4


def _build(tp):
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4,
        ffn_hidden_size=48, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, tensor_model_parallel_size=tp,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
    )  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(), V, S, position_embedding_type="rope")
    ddp = DistributedDataParallel(
        cfg, DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-2, use_distributed_optimizer=True, clip_grad=1.0), [ddp]
    )
    return ddp, opt


def _step(ddp, opt, step):
    """One step on global batch `step` (GLOBAL_B samples split over DP); returns the global loss."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    labels = torch.randint(0, V, (GLOBAL_B, S), generator=g)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = slice(dp_rank * GLOBAL_B // dp, (dp_rank + 1) * GLOBAL_B // dp)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    loss = ddp(ids[mine], None, None, labels=labels[mine]).mean()
    loss.backward()
    ddp.finish_grad_sync()
    assert opt.step()[0]
    total = loss.detach().clone()
    dist.all_reduce(total, group=ps.get_data_parallel_group())
    return (total / dp).item()


def _args(save, load, **kw):
    return argparse.Namespace(save=save, load=load, consumed_train_samples=0, **kw)


def _train_save_continue(save_dir):
    ddp, opt = _build(tp=2)
    for step in range(2):
        _step(ddp, opt, step)
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(save_dir, save_dir))
    return [_step(ddp, opt, step) for step in (2, 3)]


def _load_resave_continue(load_dir, resave_dir, tp):
    ddp, opt = _build(tp)
    it, _ = ckpt.load_checkpoint([ddp], opt, None, args=_args(resave_dir, load_dir))
    assert it == 2
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(resave_dir, load_dir))
    return [_step(ddp, opt, step) for step in (2, 3)]


def _full(ckpt_dir):
    return dc.load_plain_tensors(f"{ckpt_dir}/iter_0000002")


@pytest.mark.slow
def test_gpt_checkpoint_reshards_weights_and_adam_moments(tmp_path):
    src = str(tmp_path / "tp2dp2")
    ref_losses = run_distributed(_train_save_continue, 4, args=(src,))[0]
    source = _full(src)
    # Megatron's stacked layer keys: a leading num_layers axis; GLU fc1 as [all gate; all up]
    assert source["decoder.layers.mlp.linear_fc1.weight"].shape == (2, 2 * 48, 32)
    assert source["optimizer.state.exp_avg_sq.decoder.layers.mlp.linear_fc1.weight"].shape[0] == 2
    layouts = (("tp2dp2", 4, 2), ("tp1dp4", 4, 1), ("tp4dp1", 4, 4), ("tp1dp1", 1, 1))
    for name, world, tp in layouts:
        dst = str(tmp_path / name)
        losses = run_distributed(_load_resave_continue, world, args=(src, dst, tp))[0]
        again = _full(dst)
        assert sorted(again) == sorted(source), name
        for key in source:
            assert torch.equal(again[key], source[key]), (name, key)
        if name == "tp2dp2":  # same layout, new process group: exact resume
            assert losses == ref_losses
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=1e-6
        )
