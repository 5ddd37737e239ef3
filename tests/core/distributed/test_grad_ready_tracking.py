"""Which grads a bucket waits for under `overlap_grad_reduce`, on 2 gloo ranks.

The first batch learns the grads to expect (its `finish_grad_sync` launches the collective);
after it a bucket launches from the hook of its last expected grad, and `finish_grad_sync`
called before that raises AssertionError on every rank (Megatron's behaviour) instead of
launching a collective on its own. The ranks stay in step afterwards: the bucket's average
over DP, and a world all-reduce, are still right. `zero_grad_buffer` completes a collective
still in flight rather than dropping it.
"""

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _ddp(use_distributed_optimizer: bool, model=None):
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    model = model or torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)))
    cfg = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=True,
        use_distributed_optimizer=use_distributed_optimizer,
        average_in_collective=True,
        bucket_size=None,  # one bucket: every param
    )
    return DistributedDataParallel(cfg, ddp_config, model)


def _early_finish_raises_then_ranks_stay_in_step(use_distributed_optimizer: bool):
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps

    ps.initialize_model_parallel()  # DP = 2
    rank = dist.get_rank()
    ddp = _ddp(use_distributed_optimizer)
    (group,) = ddp.bucket_groups
    params = list(ddp.module.parameters())
    # First batch: every grad reported, finish_grad_sync launches and waits.
    for p in params:
        group.register_grad_ready(p)
    assert group.grad_reduce_handle is None  # the first batch never launches from a hook
    group.finish_grad_sync()
    ddp.zero_grad_buffer()
    assert not group.is_first_batch and len(group.golden_per_param_grad_ready_counts) == 6

    # Second batch: rank r's grads are r + 1; the average is 1.5 on both ranks.
    group.buckets[0].grad_data.fill_(rank + 1.0)
    errors = []
    for p in params[:-1]:
        group.register_grad_ready(p)
        try:
            group.finish_grad_sync()
        except AssertionError as err:
            errors.append(str(err))
    group.register_grad_ready(params[-1])  # the last expected grad launches the collective
    launched = group.grad_reduce_handle is not None
    group.finish_grad_sync()
    data = group.buckets[0].grad_data
    shard = data.view(2, -1)[rank] if use_distributed_optimizer else data
    averaged = bool(torch.all(shard == 1.5))
    world = torch.ones(1)
    dist.all_reduce(world)
    return len(errors), errors[-1], launched, averaged, world.item()


@pytest.mark.parametrize("use_distributed_optimizer", [False, True])
def test_finish_before_all_grads_raises_on_every_rank_and_ranks_stay_in_step(
    use_distributed_optimizer,
):
    results = run_distributed(
        _early_finish_raises_then_ranks_stay_in_step,
        2,
        args=(use_distributed_optimizer,),
        timeout=90,
    )
    for n_errors, message, launched, averaged, world in results:
        assert n_errors == 5  # one per early finish_grad_sync, none a collective
        assert "5/6 params reported their grad" in message, message
        assert launched and averaged
        assert world == 2.0


class _FakeHandle:
    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


def _reset_completes_in_flight_collective():
    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import param_and_grad_buffer as pgb

    ps.initialize_model_parallel()
    ddp = _ddp(use_distributed_optimizer=True)
    (group,) = ddp.bucket_groups
    log = []

    def fake_reduce_scatter(out, inp, op, group, async_op):
        out.fill_(7.0)
        return _FakeHandle(log)

    pgb.dist_reduce_scatter_func = fake_reduce_scatter
    try:
        group.start_grad_sync()  # in flight
        ddp.zero_grad_buffer()
    finally:
        pgb.dist_reduce_scatter_func = pgb.reduce_scatter_into
    return log, group.grad_reduce_handle is None


def test_zero_grad_buffer_completes_a_collective_in_flight():
    for log, cleared in run_distributed(_reset_completes_in_flight_collective, 2, timeout=90):
        assert log == ["wait"] and cleared


class _SkipsLast(torch.nn.Module):
    """Three linears; `use_last` decides whether the third takes part."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.use_last = False

    def forward(self, x):
        for layer in self.layers[: 3 if self.use_last else 2]:
            x = layer(x)
        return x


def _unused_param_steps():
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps

    ps.initialize_model_parallel()
    model = _SkipsLast()
    ddp = _ddp(use_distributed_optimizer=False, model=model)
    x = torch.full((4, 8), float(dist.get_rank() + 1))
    grads = []
    for _ in range(2):  # the third linear never used: learned in the first batch, then fine
        ddp.zero_grad_buffer()
        ddp(x).sum().backward()
        ddp.finish_grad_sync()
        grads.append(model.layers[0].weight.main_grad.clone())
    ddp.zero_grad_buffer()
    model.use_last = True  # a grad the first batch did not have: never launches by itself
    ddp(x).sum().backward()
    try:
        ddp.finish_grad_sync()
        message = ""
    except AssertionError as err:
        message = str(err)
    return grads, message


def test_params_unused_since_the_first_batch_reduce_and_a_new_grad_is_an_error():
    results = run_distributed(_unused_param_steps, 2, timeout=90)
    (g0, m0), (g1, m1) = results
    torch.testing.assert_close(g0[0], g1[0], rtol=0, atol=0)  # averaged over DP
    torch.testing.assert_close(g0[0], g0[1], rtol=0, atol=0)
    assert "was not launched" in m0 and "was not launched" in m1
