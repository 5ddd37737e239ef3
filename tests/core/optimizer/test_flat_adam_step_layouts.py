"""OptimizerConfig.flat_adam_step=True (core/optimizer/_flat_adam_step.py) on the layouts the
distributed optimizer shards: two model chunks (VPP-style per_model_buffers), a model with fp32
and bf16 params (two buffers per chunk), expert params (allreduce=False: expert_parallel_buffers
over the expert-DP group, EP = 1 and EP = 2 on 2 gloo ranks), tiny buckets (params that miss
this rank's shard), and param groups with their own lr / betas / eps / weight decay
(config_overrides). Main params, Adam state, steps and model params against the torch step;
every flat view lies at the model param's own range of the shard."""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, ParamKey, get_megatron_optimizer
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


class _Chunk(torch.nn.Module):
    """[B, 8] -> [B, 8]: bf16 linear, fp32 LayerNorm, bf16 "expert" linear (allreduce=False)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 12).to(torch.bfloat16)
        self.norm = torch.nn.LayerNorm(12)  # fp32: a second buffer
        self.expert = torch.nn.Linear(12, 8).to(torch.bfloat16)
        for p in self.expert.parameters():
            p.allreduce = False

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.fc1(x.bfloat16())).float())
        return self.expert(h.bfloat16()).float()


def _build(flat: bool, decoupled: bool):
    torch.manual_seed(0)
    chunks = [_Chunk(), _Chunk()]
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, bucket_size=40
    )
    ddps = [DistributedDataParallel(ModelParallelConfig(), ddp_config, c) for c in chunks]
    config = OptimizerConfig(
        lr=1e-2,
        weight_decay=0.1,
        clip_grad=0.05,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
        decoupled_weight_decay=decoupled,
        flat_adam_step=flat,
    )
    overrides = {
        ParamKey(name="*.bias"): {"wd_mult": 0.0},
        ParamKey(name="*norm*"): {"lr": 3e-2, "betas": (0.8, 0.95), "eps": 1e-4},
        ParamKey(name="*fc1.weight"): {"lr": 2e-3, "wd_mult": 2.0, "betas": (0.5, 0.9)},
    }
    opt = get_megatron_optimizer(config, ddps, config_overrides=overrides)
    return chunks, ddps, opt


def _check_views(opt) -> int:
    """Each main param's flat view must be the model param's range of the shard."""
    n = 0
    for sub in opt.chained_optimizers:
        flat = sub._flat_step
        where = {id(m): (p, lo, hi) for p, m, lo, hi in sub._entries()}
        for main, seg, a, b in flat.views:
            param, lo, hi = where[id(main)]
            assert b - a == hi - lo and 0 <= a and b <= seg.main.numel()
            # the grad view the step reads is the param's main_grad range
            want = param.main_grad.view(-1)[lo:hi]
            assert seg.grad[a:b].data_ptr() == want.data_ptr()
            n += 1
    return n


def _step(chunks, ddps, opt, step: int) -> None:
    g = torch.Generator().manual_seed(100 * step + torch.distributed.get_rank())
    for d in ddps:
        d.zero_grad_buffer()
    opt.zero_grad()
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    torch.nn.functional.mse_loss(chunks[1](chunks[0](x)), y).backward()
    finalize_model_grads(ddps)
    if step == 2:
        for group in opt.param_groups:
            group["lr"] = group["lr"] * 0.5  # a scheduler's change
    ok, norm, _ = opt.step()
    assert ok


def _snapshot(chunks, opt) -> dict:
    out = {"model": [p.detach().float().clone() for c in chunks for p in c.parameters()]}
    for sub in opt.chained_optimizers:
        inner = sub.optimizer
        mains = [m for g in inner.param_groups for m in g["params"]]
        out.setdefault("main", []).extend(m.detach().clone() for m in mains)
        for key in ("exp_avg", "exp_avg_sq"):
            out.setdefault(key, []).extend(inner.state[m][key].clone() for m in mains)
        out.setdefault("step", []).extend(float(inner.state[m]["step"]) for m in mains)
    return out


def _compare(ep: int):
    ps.initialize_model_parallel(expert_model_parallel_size=ep)
    out = {}
    for decoupled in (True, False):
        snaps = []
        for flat in (False, True):
            chunks, ddps, opt = _build(flat, decoupled)
            assert len(opt.chained_optimizers) == 2  # dense + expert
            if flat:
                assert _check_views(opt) > 0
            for step in range(4):
                _step(chunks, ddps, opt, step)
            snaps.append(_snapshot(chunks, opt))
        out[decoupled] = snaps
    return out


def _assert_same(results):
    for per_rank in results:
        for key, (ref, flat) in per_rank.items():
            assert ref["step"] == flat["step"] == [4.0] * len(ref["step"]), key
            for name in ("main", "exp_avg", "exp_avg_sq"):
                for a, b in zip(flat[name], ref[name], strict=True):
                    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                    assert err <= 2e-6, (key, name, err)
            for a, b in zip(flat["model"], ref["model"], strict=True):
                torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6, msg=f"{key} model")


def test_flat_step_layouts_expert_dp2():
    _assert_same(run_distributed(_compare, 2, args=(1,), timeout=180))


def test_flat_step_layouts_expert_parallel2():
    _assert_same(run_distributed(_compare, 2, args=(2,), timeout=180))
