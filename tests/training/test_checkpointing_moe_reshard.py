"""MoE training checkpoints reshard across expert-parallel sizes (global expert keys).

A 2-layer MoE GPTModel (4 experts, top-2; SequentialMLP and GroupedMLP) + DDP + Adam is trained
one step and saved with `gigatron.training.checkpointing.save_checkpoint` at EP2 x expert-DP2
(4 gloo ranks), then loaded at EP1 (1 rank) and EP4 (4 ranks) and saved again: every full
tensor of the re-saved checkpoint (weights and Adam moments, experts included) equals the
source's bitwise, and the loaded model's logits equal the source model's (<= 1e-6) on the same
input. EP1 -> EP2 and TP2 x ETP2 x EP2 -> TP1 x EP1 likewise.
"""

import argparse

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import dist_checkpointing as dc
from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from gigatron.training import checkpointing as ckpt

pytestmark = pytest.mark.multirank


E, V, S, B = 4, 64, 16, 2


def _build(ep: int, grouped: bool, seed: int, tp: int = 1, dist_opt: bool = False):
    ps.initialize_model_parallel(tp, expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
        num_moe_experts=E, moe_router_topk=2, moe_ffn_hidden_size=32,
        moe_token_dispatcher_type="alltoall", moe_grouped_gemm=grouped,
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, expert_model_parallel_size=ep,
        tensor_model_parallel_size=tp, sequence_parallel=tp > 1,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(num_experts=E, moe_grouped_gemm=grouped)
    model = GPTModel(cfg, spec, V, S, position_embedding_type="rope")
    ddp_cfg = DistributedDataParallelConfig(use_distributed_optimizer=dist_opt)
    ddp = DistributedDataParallel(cfg, ddp_cfg, model)
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-2, use_distributed_optimizer=dist_opt), [ddp]
    )
    return model, ddp, opt


def _ids(seed: int):
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


def _logits(model):
    model.eval()
    with torch.no_grad():
        out = model(_ids(7), None, None)  # [b, s, V/tp]
    parts = [torch.empty_like(out) for _ in range(ps.get_tensor_model_parallel_world_size())]
    torch.distributed.all_gather(parts, out, group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)  # [b, s, V]


def _args(save, load):
    return argparse.Namespace(save=save, load=load, consumed_train_samples=0)


def _step(ddp, opt, seed: int) -> None:
    ddp.zero_grad_buffer()
    opt.zero_grad()
    ids = _ids(seed)
    ddp(ids, None, None, labels=ids).mean().backward()
    finalize_model_grads([ddp])  # DP/expert-DP grads, and SP norm/router grads over TP
    assert opt.step()[0]


def _train_save(save_dir: str, ep: int, grouped: bool, tp: int = 1, dist_opt: bool = False):
    """Differently seeded per layout: the loaded weights must come from the checkpoint."""
    model, ddp, opt = _build(ep, grouped, seed=1, tp=tp, dist_opt=dist_opt)
    _step(ddp, opt, 3)
    ckpt.save_checkpoint(1, [ddp], opt, None, args=_args(save_dir, save_dir))
    return _logits(model)


def _train_save_next_step(save_dir: str, ep: int, grouped: bool, tp: int, dist_opt: bool):
    """`_train_save`, then the next step in the same model and optimizer (the source layout's
    own continuation, which never went through the checkpoint): its logits."""
    model, ddp, opt = _build(ep, grouped, seed=1, tp=tp, dist_opt=dist_opt)
    _step(ddp, opt, 3)
    ckpt.save_checkpoint(1, [ddp], opt, None, args=_args(save_dir, save_dir))
    _step(ddp, opt, 4)
    return _logits(model)


def _next_step(load_dir: str, ep: int, grouped: bool, tp: int, dist_opt: bool = False):
    """Load, take the next step (Adam moments from the checkpoint), return the logits."""
    model, ddp, opt = _build(ep, grouped, seed=2, tp=tp, dist_opt=dist_opt)
    ckpt.load_checkpoint([ddp], opt, None, args=_args(None, load_dir))
    _step(ddp, opt, 4)
    return _logits(model)


def _load_resave(load_dir: str, resave_dir: str, ep: int, grouped: bool, tp: int = 1):
    model, ddp, opt = _build(ep, grouped, seed=2, tp=tp)
    it, _ = ckpt.load_checkpoint([ddp], opt, None, args=_args(resave_dir, load_dir))
    assert it == 1
    ckpt.save_checkpoint(1, [ddp], opt, None, args=_args(resave_dir, load_dir))
    return _logits(model)


def _full(root: str) -> dict:
    return dc.load_plain_tensors(f"{root}/iter_0000001")


def _check(source: dict, ref_logits, dst: str, logits, name: str, grouped: bool) -> None:
    again = _full(dst)
    assert sorted(again) == sorted(source), name
    for key in source:
        assert torch.equal(again[key], source[key]), (name, key)
    err = (logits - ref_logits).abs().max().item()
    print(f"{name}: max |logits - source| = {err:.2e}")
    assert err <= 1e-6, (name, err)


def _expert_keys(source: dict, grouped: bool) -> None:
    """Experts are saved globally, as megatron-core keys them: all E of them on an expert axis
    after the layer axis (`mlp.experts.experts.<name>`), whatever EP the source ran at; the
    GroupedMLP weights in the same transposed form (SequentialMLP's)."""
    fc1 = source["decoder.layers.mlp.experts.experts.linear_fc1.weight"]
    fc2 = source["decoder.layers.mlp.experts.experts.linear_fc2.weight"]
    assert fc1.shape == (2, E, 2 * 32, 32) and fc2.shape == (2, E, 32, 32)
    if grouped:  # optimizer state in the weights' memory layout [L, E, h, glu, f] / [L, E, f, h]
        assert source["optimizer.state.exp_avg.decoder.layers.mlp.experts.weight1"].shape == (
            2, E, 32, 2, 32
        )  # fmt: skip
        assert "optimizer.state.exp_avg.decoder.layers.mlp.experts.weight2" in source
    else:
        key = "optimizer.state.exp_avg_sq.decoder.layers.mlp.experts.experts.linear_fc1.weight"
        assert source[key].shape == fc1.shape
    assert not any(".local_experts." in k for k in source)


@pytest.mark.parametrize("grouped", [False, True], ids=["sequential", "grouped"])
def test_moe_checkpoint_ep2dp2_to_ep1_and_ep4(grouped, tmp_path):
    src = str(tmp_path / "ep2dp2")
    ref = run_distributed(_train_save, 4, args=(src, 2, grouped), timeout=240)[0]
    source = _full(src)
    _expert_keys(source, grouped)
    for name, world, ep in (("ep1", 1, 1), ("ep4", 4, 4)):
        dst = str(tmp_path / name)
        got = run_distributed(_load_resave, world, args=(src, dst, ep, grouped), timeout=240)
        _check(source, ref, dst, got[0], name, grouped)


def test_moe_checkpoint_ep1_to_ep2(tmp_path):
    src, dst = str(tmp_path / "ep1"), str(tmp_path / "ep2")
    ref = run_distributed(_train_save, 1, args=(src, 1, False), timeout=240)[0]
    source = _full(src)
    _expert_keys(source, False)
    got = run_distributed(_load_resave, 2, args=(src, dst, 2, False), timeout=240)
    _check(source, ref, dst, got[0], "ep1->ep2", False)
    torch.testing.assert_close(got[1], got[0], rtol=0, atol=0)  # both EP ranks agree


def test_moe_checkpoint_tp2_etp2_ep2_to_ep1_tp1(tmp_path):
    """Experts TP-split over the expert-TP group (TP2 = ETP2 x EP2, 4 ranks) -> one rank."""
    src, dst = str(tmp_path / "tp2ep2"), str(tmp_path / "ep1")
    ref = run_distributed(_train_save, 4, args=(src, 2, False, 2), timeout=240)[0]
    source = _full(src)
    _expert_keys(source, False)
    got = run_distributed(_load_resave, 1, args=(src, dst, 1, False), timeout=240)
    _check(source, ref, dst, got[0], "tp2etp2ep2->ep1", False)


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2_etp2_ep2", "ep2_edp2"])
@pytest.mark.parametrize("dist_opt", [False, True], ids=["adam", "distributed"])
@pytest.mark.parametrize("grouped", [False, True], ids=["sequential", "grouped"])
def test_moe_adam_moments_reshard_to_one_rank(grouped, dist_opt, tp, tmp_path):
    """TP2 x ETP2 x EP2 (or EP2 x expert-DP2) on 4 ranks -> 1 rank: the step after the load
    equals the step the source layout takes right after its save (no checkpoint in between), so
    every Adam moment reached its element.
    GroupedMLP keeps its moments in the weights' memory layout ([gate_r | up_r] per expert-TP
    rank, checked across ETP sizes); the distributed optimizer holds flat ranges of the weights
    (of the experts too at expert-DP 2)."""
    src = str(tmp_path / "src")
    args = (src, 2, grouped, tp, dist_opt)
    ref = run_distributed(_train_save_next_step, 4, args=args, timeout=240)[0]
    got = run_distributed(_next_step, 1, args=(src, 1, grouped, 1, dist_opt), timeout=240)[0]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
