"""DP = 2 equals DP = 1 with 2 accumulated microbatches, after 10 AdamW steps.

Every combination of {plain, distributed optimizer} x {overlap_grad_reduce off, on} x
{fp32, bf16 model with fp32 main params}, plus overlap_param_gather, average_in_collective and
a bf16 grad buffer, runs inside one spawn per world size (spawning is the expensive part on a
2-core machine).

Why the results can be equal to the last bit: DP=1 runs microbatches m0, m1 with loss / 2
each, so main_grad = g0/2 + g1/2; DP=2 runs m_r on rank r with loss / 1, DDP pre-scales by
1/dp = 1/2 and sums over 2 ranks: g0/2 + g1/2. Halving is exact in binary floating point and a
2-term sum is order independent, so the grads match exactly in fp32 and in bf16; the Adam
steps on the fp32 main params then match too. We still allow 1e-6 (the issue's bar) on fp32
weights; for bf16 models we check the fp32 main params to 1e-6 and the bf16 model params to
half a bf16 ulp at |w| ~ 1 (4e-3), which only matters if a reduction order ever changes.
"""

from contextlib import nullcontext

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
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


STEPS, MBS, NUM_MICRO = 10, 4, 2
# (distributed optimizer, overlap, dtype, average_in_collective); "bf16" reduces grads in fp32
# (grad_reduce_in_fp32), "bf16g" keeps a bf16 grad buffer.
COMBOS = [
    (dist_opt, overlap, dtype, False)
    for dtype in ("fp32", "bf16")
    for dist_opt in (False, True)
    for overlap in (False, True)
] + [
    (True, "param_gather", "fp32", False),
    (True, "param_gather", "bf16", False),
    (False, False, "fp32", True),
    (True, True, "bf16g", True),
]


def _model(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.LayerNorm(32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 4),
    )
    return model.to(dtype)


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, NUM_MICRO, MBS, 8, generator=g)
    y = torch.randn(STEPS, NUM_MICRO, MBS, 4, generator=g)
    return x, y


def _train(dist_opt, overlap, dtype_name, average_in_collective):
    dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = _model(dtype)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=dtype_name == "bf16",
        average_in_collective=average_in_collective,
        overlap_grad_reduce=bool(overlap),
        overlap_param_gather=overlap == "param_gather",
        use_distributed_optimizer=dist_opt,
        bucket_size=400,  # several buckets for this ~1.7k-param model
    )
    ddp = DistributedDataParallel(ModelParallelConfig(), ddp_config, model)
    opt_config = OptimizerConfig(
        lr=1e-2,
        weight_decay=0.1,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=dist_opt,
        overlap_param_gather=overlap == "param_gather",
        clip_grad=1.0,
    )
    opt = get_megatron_optimizer(opt_config, [ddp])
    x, y = _data()
    micro = list(range(NUM_MICRO)) if world == 1 else [rank]
    norms = []
    for step in range(STEPS):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        for i, m in enumerate(micro):
            last = i == len(micro) - 1
            with nullcontext() if last else ddp.no_sync():
                out = ddp(x[step, m].to(dtype))
                loss = torch.nn.functional.mse_loss(out.float(), y[step, m]) / len(micro)
                loss.backward()
        if overlap and world > 1 and step > 0:
            # Overlap really launched every bucket's collective from the backward hooks (after
            # the first batch, which learns the grads to expect and launches in finalize).
            assert len(ddp.bucket_groups) > 1
            assert all(g.grad_reduce_handle is not None for g in ddp.bucket_groups)
        assert all(p.grad is None for p in model.parameters())  # hook moved it to main_grad
        finalize_model_grads([ddp])
        ok, norm, _ = opt.step()
        assert ok
        norms.append(norm)
    ddp.start_param_sync(force_sync=True)  # overlap_param_gather leaves the last gather pending
    grad_dtype = {b.grad_dtype for b in ddp.buffers}
    assert grad_dtype == {torch.bfloat16 if dtype_name == "bf16g" else torch.float32}
    # numpy, not tensors: tensors cross processes by fd passing, which races with rank exit.
    weights = {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}
    main = {}
    if dtype == torch.bfloat16 and not dist_opt:
        params = [p for g in opt.float16_groups for p in g]
        mains = [p for g in opt.fp32_from_float16_groups for p in g]
        names = {p: n for n, p in model.named_parameters()}
        main = {names[p]: m.detach().numpy().copy() for p, m in zip(params, mains)}
    return weights, main, norms


def _run_all():
    ps.initialize_model_parallel()
    return {combo: _train(*combo) for combo in COMBOS}


def test_dp2_equals_dp1_with_accumulation():
    ref = run_distributed(_run_all, 1)[0]
    dp2 = run_distributed(_run_all, 2)
    for combo in COMBOS:
        w1, main1, norms1 = ref[combo]
        for rank in range(2):
            w2, main2, norms2 = dp2[rank][combo]
            tol = 1e-6 if combo[2] == "fp32" else 4e-3
            for name in w1:
                torch.testing.assert_close(
                    torch.from_numpy(w2[name]),
                    torch.from_numpy(w1[name]),
                    atol=tol,
                    rtol=0,
                    msg=lambda m, tag=f"{combo} rank {rank} {name}": f"{tag}: {m}",
                )
            for name in main1:
                torch.testing.assert_close(
                    torch.from_numpy(main2[name]), torch.from_numpy(main1[name]), atol=1e-6, rtol=0
                )
            torch.testing.assert_close(
                torch.tensor(norms2), torch.tensor(norms1), rtol=1e-6, atol=0
            )
        # The model actually trained (weights moved from their initial values).
        init = dict(_model(torch.float32).named_parameters())
        moved = max(abs(w1[n] - init[n].detach().numpy()).max() for n in w1)
        assert moved > 1e-3, combo


def test_distributed_optimizer_bucket_layout():
    run_distributed(_check_layout, 2)


def _check_layout():
    ps.initialize_model_parallel()
    model = _model(torch.float32)
    ddp = DistributedDataParallel(
        ModelParallelConfig(),
        DistributedDataParallelConfig(
            use_distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=400
        ),
        model,
    )
    (buffer,) = ddp.buffers
    for start, end in buffer.bucket_indices:
        assert (end - start) % 128 == 0 and start % 128 == 0  # lcm(dp=2, 128) padding
    for p in model.parameters():
        start, end, _ = buffer.param_index_map[p]
        assert start % 64 == 0 and end - start == p.numel()
        assert p.data_ptr() == buffer.param_data[start:].data_ptr()  # param lives in the buffer
        assert p.main_grad.data_ptr() == buffer.grad_data[start:].data_ptr()
    # Reverse order: the last layer's params come first.
    assert buffer.param_index_map[model[5].bias][0] == 0
