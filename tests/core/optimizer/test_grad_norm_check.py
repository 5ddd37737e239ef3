"""`step(check_grad_norm=True)`: `step()` whose clipping norm doubles as the NaN/Inf gradient
check. Finite grads: the very same update as `step()`; a NaN / Inf grad, or finite grads whose
sum of squares overflows fp32: `(False, norm, None)` and nothing changes (model params, fp32 main
params, Adam state), for the fp32, bf16, chained and distributed optimizers (torch and flat Adam
step) on a one-process gloo world."""

import math

import pytest
import torch

from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()

KINDS = ["fp32", "bf16", "chained", "distributed", "distributed-flat"]


def _build(kind: str, sync_free: bool = False):
    torch.manual_seed(0)
    dtype = torch.float32 if kind in ("fp32", "chained") else torch.bfloat16
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    ).to(dtype)
    if kind == "chained":
        for p in model[3].parameters():
            p.allreduce = False  # expert params: a second optimizer
    distributed = kind.startswith("distributed")
    config = OptimizerConfig(
        lr=1e-2,
        weight_decay=0.1,
        clip_grad=0.05,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=distributed,
        flat_adam_step=kind == "distributed-flat",
        sync_free_step=sync_free,
    )
    chunk = model
    if distributed:
        ddp_config = DistributedDataParallelConfig(
            use_distributed_optimizer=True, grad_reduce_in_fp32=True, bucket_size=64
        )
        chunk = DistributedDataParallel(ModelParallelConfig(), ddp_config, model)
    opt = get_megatron_optimizer(config, [chunk])
    if kind == "distributed-flat":
        assert opt._flat_step is not None
    return model, chunk, opt


def _backward(model, chunk, opt, step: int, poison=None) -> None:
    if isinstance(chunk, DistributedDataParallel):
        chunk.zero_grad_buffer()
    opt.zero_grad()
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
    dtype = next(model.parameters()).dtype
    torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
    if isinstance(chunk, DistributedDataParallel):
        chunk.finish_grad_sync()
    if poison is not None:
        for p in model.parameters():
            grad = p.main_grad if hasattr(p, "main_grad") else p.grad
            poison(grad)


def _state(model, opt) -> list[torch.Tensor]:
    out = [p.detach().float().clone() for p in model.parameters()]
    for inner in getattr(opt, "chained_optimizers", [opt]):
        for group in inner.optimizer.param_groups:
            for main in group["params"]:
                out.append(main.detach().clone())
                out += [t.clone() for t in inner.optimizer.state[main].values()]
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_finite_grads_step_exactly_as_step(kind):
    a, chunk_a, opt_a = _build(kind)
    b, chunk_b, opt_b = _build(kind)
    for step in range(3):
        _backward(a, chunk_a, opt_a, step)
        _backward(b, chunk_b, opt_b, step)
        ok_a, norm_a, zeros_a = opt_a.step()
        ok_b, norm_b, zeros_b = opt_b.step(check_grad_norm=True)
        assert ok_a and ok_b and norm_a == norm_b > 0.05 and zeros_a == zeros_b
    for x, y in zip(_state(a, opt_a), _state(b, opt_b), strict=True):
        assert torch.equal(x, y)


def _nan_one(grad):
    grad.view(-1)[0] = float("nan")


def _inf_one(grad):
    grad.view(-1)[-1] = float("-inf")


def _huge(grad):  # finite, but the sum of squares overflows fp32
    grad.fill_(3e19)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("poison, want", [(_nan_one, "nan"), (_inf_one, "inf"), (_huge, "inf")])
def test_nonfinite_norm_skips_the_update(kind, poison, want):
    model, chunk, opt = _build(kind)
    _backward(model, chunk, opt, 0)
    assert opt.step(check_grad_norm=True)[0]  # a good step first: Adam state exists
    before = _state(model, opt)
    _backward(model, chunk, opt, 1, poison=poison)
    ok, norm, zeros = opt.step(check_grad_norm=True)
    assert not ok and zeros is None
    assert math.isnan(norm) if want == "nan" else norm == math.inf, norm
    after = _state(model, opt)
    assert len(after) == len(before)
    for x, y in zip(before, after):
        assert torch.equal(x, y)
    _backward(model, chunk, opt, 2)  # and the next good step runs
    ok, norm, _ = opt.step(check_grad_norm=True)
    assert ok and math.isfinite(norm)


def test_needs_clipping():
    model = torch.nn.Linear(4, 4)
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-3, clip_grad=0.0), [model])
    with pytest.raises(ValueError, match=r"needs clip_grad > 0 \(got 0.0\)"):
        opt.step(check_grad_norm=True)
