"""The distributed optimizer holds 1/DP of the optimizer state per rank (measured in bytes), and
its per-rank state_dict round-trips.

DP = 4. Adam keeps exp_avg and exp_avg_sq (fp32) per element it steps; a bf16 model adds fp32
main params. The plain optimizer holds all of it on every rank; the distributed one only its
shard: bytes(rank) = total / 4 up to the bucket padding (< 128 elements per bucket here) and the
shards add up to exactly the plain optimizer's state.
"""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


DP = 4


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


def _state_bytes(opt) -> tuple[int, int]:
    """(Adam state bytes, fp32 main-param bytes) held by this rank."""
    state = sum(
        t.numel() * t.element_size()
        for s in opt.optimizer.state.values()
        for k, t in s.items()
        if k != "step"
    )
    main = 0
    if hasattr(opt, "shard_groups"):
        main = sum(
            m.numel() * 4 for g in opt.shard_groups for p, m, _, _ in g if p.dtype != torch.float32
        )
    elif hasattr(opt, "fp32_from_float16_groups"):
        main = sum(m.numel() * 4 for g in opt.fp32_from_float16_groups for m in g)
    return state, main


def _one_step(dtype, dist_opt):
    model = _model().to(dtype)
    ddp = DistributedDataParallel(
        ModelParallelConfig(),
        DistributedDataParallelConfig(
            use_distributed_optimizer=dist_opt, grad_reduce_in_fp32=dtype != torch.float32
        ),
        model,
    )
    config = OptimizerConfig(
        lr=1e-3,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=dist_opt,
    )
    opt = get_megatron_optimizer(config, [ddp])
    ddp.zero_grad_buffer()
    model(torch.randn(4, 32).to(dtype)).float().pow(2).mean().backward()
    ddp.finish_grad_sync()
    assert opt.step()[0]
    return model, ddp, opt


def _body():
    ps.initialize_model_parallel()
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        _, _, plain = _one_step(dtype, False)
        model, ddp, dist = _one_step(dtype, True)
        out[str(dtype)] = (_state_bytes(plain), _state_bytes(dist), ddp.buffers[0].numel)
    # state_dict round trip: save, take a step, load, and the next step repeats exactly.
    model, ddp, opt = _one_step(torch.bfloat16, True)
    saved_sd = {k: v for k, v in opt.state_dict().items()}
    saved_sd = torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, saved_sd
    )
    saved_w = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(5)).bfloat16()

    def step():
        ddp.zero_grad_buffer()
        model(x).float().pow(2).mean().backward()
        ddp.finish_grad_sync()
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    first = step()
    with torch.no_grad():
        for p, w in zip(model.parameters(), saved_w):
            p.copy_(w)
    opt.load_state_dict(saved_sd)
    again = step()
    out["roundtrip_equal"] = all(torch.equal(a, b) for a, b in zip(first, again))
    return out


def test_distributed_optimizer_state_is_sharded():
    per_rank = run_distributed(_body, DP)
    for dtype in ("torch.float32", "torch.bfloat16"):
        (plain_state, plain_main), _, padded_numel = per_rank[0][dtype]
        numel = sum(p.numel() for p in _model().parameters())
        assert plain_state == 2 * 4 * numel  # exp_avg + exp_avg_sq, fp32
        assert plain_main == (4 * numel if dtype == "torch.bfloat16" else 0)
        total_state = sum(r[dtype][1][0] for r in per_rank)
        total_main = sum(r[dtype][1][1] for r in per_rank)
        assert total_state == plain_state and total_main == plain_main, dtype
        for rank in range(DP):
            state, main = per_rank[rank][dtype][1]
            # Within one bucket's padding of exactly 1/DP (padding holds no state).
            slack = 2 * 4 * (padded_numel - numel)
            assert abs(state - plain_state / DP) <= slack, (dtype, rank, state, plain_state)
            assert state < plain_state / 2, (dtype, rank)
            assert abs(main - plain_main / DP) <= slack / 2, (dtype, rank, main)
    assert all(r["roundtrip_equal"] for r in per_rank)
