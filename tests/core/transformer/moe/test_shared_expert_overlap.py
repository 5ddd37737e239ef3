"""moe_shared_expert_overlap: the shared experts computed while the alltoall dispatcher's
all-to-alls are in flight give the same outputs, input grads and weight grads (router, experts,
shared experts; through DDP + finalize_model_grads) as the same layer without the overlap and as
the unsharded one-rank twin, at EP 2 (x expert-DP 2) and TP 2 x EP 2 (SP, expert TP 2), in one
spawn of 4 ranks. The twin runs every DP rank's micro-batch (helpers and the loss as in
test_expert_parallel.py). Also: the allgather dispatcher refuses the flag (Megatron's rule)."""

import contextlib
import dataclasses

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.tensor_parallel import async_mappings
from gigatron.core.transformer.moe.experts import GroupedMLP
from gigatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from gigatron.core.transformer.moe.shared_experts import SharedExpertMLP, SharedExpertState
from gigatron.core.transformer.spec_utils import ModuleSpec
from gigatron.testing import run_distributed
from tests.core.transformer.moe.test_expert_parallel import (
    B_LOCAL,
    MLP_SUB,
    E,
    H,
    S,
    _config,
    _expert_grads,
    _full_weights,
    _load,
    _self_groups,
    _shard,
)

pytestmark = pytest.mark.multirank

F_SHARED = 12


def _shared_config(tp, ep, etp, overlap, dispatcher="alltoall", gate=False):
    cfg = _config(tp, ep, etp, dispatcher, True)
    return dataclasses.replace(
        cfg,
        moe_shared_expert_intermediate_size=F_SHARED,
        moe_shared_expert_overlap=overlap,
        moe_shared_expert_gate=gate,
    )


def _layer(cfg, pg_collection=None):
    sub = MoESubmodules(
        experts=ModuleSpec(module=GroupedMLP),
        shared_experts=ModuleSpec(module=SharedExpertMLP, submodules=MLP_SUB),
    )
    return MoELayer(cfg, sub, pg_collection=pg_collection).train()


def _shared_weights():
    g = torch.Generator().manual_seed(9)
    return torch.randn(2 * F_SHARED, H, generator=g) * 0.3, torch.randn(
        H, F_SHARED, generator=g
    ) * 0.3


def _gate_weight():
    """The shared experts' gate [1, h] (moe_shared_expert_gate)."""
    return torch.randn(1, H, generator=torch.Generator().manual_seed(13)) * 0.5


def _shard_shared(fc1, fc2, tp, tp_rank):
    """The shared experts' [gate; up] rows and fc2 columns of TP rank `tp_rank`."""
    f = F_SHARED // tp
    sl = slice(tp_rank * f, (tp_rank + 1) * f)
    gate, up = fc1.chunk(2, dim=0)
    return torch.cat([gate[sl], up[sl]]), fc2[:, sl]


def _load_all(layer, weights, shared, experts_idx, etp, etp_rank, tp, tp_rank):
    _load(layer, weights, experts_idx, etp, etp_rank)
    fc1, fc2 = _shard_shared(*shared, tp, tp_rank)
    with torch.no_grad():
        layer.shared_experts.linear_fc1.weight.copy_(fc1)
        layer.shared_experts.linear_fc2.weight.copy_(fc2)
        if layer.shared_experts.use_shared_expert_gate:
            layer.shared_experts.gate_weight.copy_(_gate_weight())


# forward: dispatch tokens + probs started, shared fc1, their waits, combine started, shared
# fc2, its wait; backward: the reverse combine started, shared fc2's weight grad, its wait, the
# reverse dispatch started, shared fc1's weight grad, the waits
OVERLAP_ORDER = (
    "start start fc1 wait wait start fc2 wait start dW2 wait start start dW1 wait wait".split()
)


@contextlib.contextmanager
def _events(shared):
    """Record the async all-to-alls' starts and waits, and the shared experts' fc1 / fc2
    forwards and weight grads, in order."""
    events, start, finish = [], async_mappings._start_all_to_all, async_mappings._finish
    wait_fn = async_mappings._AllToAllWait

    class _Wait:
        @staticmethod
        def apply(*args):
            events.append("wait")
            return wait_fn.apply(*args)

    async_mappings._start_all_to_all = lambda *a: events.append("start") or start(*a)
    async_mappings._finish = lambda *a: events.append("wait") or finish(*a)
    async_mappings._AllToAllWait = _Wait
    hooks = [
        shared.linear_fc1.register_forward_hook(lambda *_: events.append("fc1")),
        shared.linear_fc2.register_forward_hook(lambda *_: events.append("fc2")),
        shared.linear_fc1.weight.register_hook(lambda _: events.append("dW1")),
        shared.linear_fc2.weight.register_hook(lambda _: events.append("dW2")),
    ]
    try:
        yield events
    finally:
        async_mappings._start_all_to_all, async_mappings._finish = start, finish
        async_mappings._AllToAllWait = wait_fn
        for hook in hooks:
            hook.remove()


def _grad(p):
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def _layout(tp, ep, etp, self_pg, gate=False):
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    dp = ps.get_data_parallel_world_size()
    ep_rank, etp_rank = ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()
    weights, shared = _full_weights(), _shared_weights()
    g = torch.Generator().manual_seed(11)
    x_full = torch.randn(S, B_LOCAL * dp, H, generator=g)
    dy_full = torch.randn(S, B_LOCAL * dp, H, generator=g)
    s_sl = slice(tp_rank * S // tp, (tp_rank + 1) * S // tp)
    b_sl = slice(dp_rank * B_LOCAL, (dp_rank + 1) * B_LOCAL)
    n_local = E // ep

    ref = _layer(_shared_config(1, 1, 1, False, gate=gate), self_pg)
    _load_all(ref, weights, shared, range(E), 1, 0, 1, 0)
    xr = x_full.clone().requires_grad_()
    outs = []
    for d in range(dp):  # one micro-batch per DP rank: the aux losses are per batch
        bs = slice(d * B_LOCAL, (d + 1) * B_LOCAL)
        out_d, _ = ref(xr[:, bs])
        (out_d * dy_full[:, bs]).sum().backward()
        outs.append(out_d.detach())
    want = [torch.cat(outs, dim=1)[s_sl, b_sl], xr.grad[s_sl, b_sl], ref.router.weight.grad / dp]
    ref_experts = _expert_grads(ref)
    for i in range(n_local):
        want += [r / dp for r in _shard(*ref_experts[ep_rank * n_local + i], etp, etp_rank)]
    ref_shared = (
        ref.shared_experts.linear_fc1.weight.grad,
        ref.shared_experts.linear_fc2.weight.grad,
    )
    want += [r / dp for r in _shard_shared(*ref_shared, tp, tp_rank)]
    if gate:  # replicated over TP: under SP each rank's partial grad is summed over TP
        want.append(ref.shared_experts.gate_weight.grad / dp)

    results = {}
    for overlap in (False, True):
        cfg = _shared_config(tp, ep, etp, overlap, gate=gate)
        layer = _layer(cfg)
        assert (layer.token_dispatcher.shared_experts is not None) == overlap
        _load_all(
            layer, weights, shared, range(ep_rank * n_local, (ep_rank + 1) * n_local),
            etp, etp_rank, tp, tp_rank,
        )  # fmt: skip
        ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), layer)
        x = x_full[s_sl, b_sl].clone().requires_grad_()
        if overlap:  # as if an earlier forward raised after fc1: the next one starts clean
            layer.shared_experts._overlap_state = SharedExpertState.FC1_FORWARD_DONE
            layer.shared_experts.cached_fc2_input = torch.ones(1)
        with _events(layer.shared_experts) as events:
            out, _ = ddp(x)
            (out * dy_full[s_sl, b_sl]).sum().backward()
        assert events == (OVERLAP_ORDER if overlap else ["fc1", "fc2", "dW2", "dW1"]), events
        finalize_model_grads([ddp])
        got = [out.detach(), x.grad, _grad(layer.router.weight)]
        got += [t for pair in _expert_grads(layer) for t in pair]
        sh = layer.shared_experts
        got += [_grad(sh.linear_fc1.weight), _grad(sh.linear_fc2.weight)]
        if gate:
            got.append(_grad(sh.gate_weight))
            assert sh.gate_score is None  # the overlapped forward dropped its cached score
        results[overlap] = got
    errors = []  # fp32 sums in other orders: relative 1e-6 of values up to ~10
    for i, (a, b, r) in enumerate(zip(results[True], results[False], want, strict=True)):
        # bitwise but for the input grad, whose parts (router, shared experts, dispatch) add up
        # in another order when the shared experts run after the router (as in Megatron)
        tol = 1e-6 if i == 1 else 0.0
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"overlap vs not, item {i}")
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-6, msg=f"overlap vs twin, item {i}")
        assert r.abs().max() > 0, i  # every compared tensor carries a signal
        scale = r.abs().max().item()
        errors.append(max((a - b).abs().max().item(), (a - r).abs().max().item()) / scale)
    ps.destroy_model_parallel()
    return max(errors)


def _run():
    self_pg = _self_groups()
    with pytest.raises(ValueError, match="moe_shared_expert_overlap=True requires"):
        _layer(_shared_config(1, 1, 1, True, "allgather"), self_pg)
    return [_layout(1, 2, 1, self_pg), _layout(2, 2, 2, self_pg)]


def test_shared_expert_overlap_matches_sequential_and_ep1():
    reports = run_distributed(_run, 4, timeout=240)
    worst = max(max(r) for r in reports)
    print(f"shared-expert overlap EP2 / TP2xEP2: worst error / max |value| {worst:.2e}")
    assert worst <= 1e-6


def _compiled_ep2():
    """EP 2, overlap on: the layer compiled (AOT autograd; its graphs break at the host-side
    split sizes, so the all-to-alls run between graphs) equals eager over two steps, and the
    shared experts end each step IDLE."""
    ps.initialize_model_parallel(expert_model_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    n_local = E // 2
    experts = range(
        ps.get_expert_model_parallel_rank() * n_local,
        (ps.get_expert_model_parallel_rank() + 1) * n_local,
    )
    outs = []
    for compiled in (False, True):
        layer = _layer(_shared_config(1, 2, 1, True))
        _load_all(layer, _full_weights(), _shared_weights(), experts, 1, 0, 1, 0)
        g = torch.Generator().manual_seed(5 + torch.distributed.get_rank())
        x = torch.randn(S, B_LOCAL, H, generator=g).requires_grad_()
        run = torch.compile(layer, backend="aot_eager") if compiled else layer
        for _ in range(2):
            x.grad = None
            out, _ = run(x)
            out.sum().backward()
            assert layer.shared_experts._overlap_state == SharedExpertState.IDLE
        outs.append((out.detach(), x.grad.clone(), layer.shared_experts.linear_fc1.weight.grad))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ps.destroy_model_parallel()


def test_compiled_layer_with_overlap_equals_eager_at_ep2():
    torch._dynamo.reset()
    run_distributed(_compiled_ep2, 2, timeout=240)
