"""OptimizerConfig.flat_adam_step=True runs the torch optimizer's step hooks as its torch step does
(DP = 2 gloo ranks, bf16 model, AdamW): global and per-optimizer pre hooks before the update,
post hooks after it, in torch's order, with the arguments torch passes (the optimizer, (opt,),
{}); a pre hook's change of lr takes effect, and one that hands the step a closure gets it
called (grad enabled, as Adam.step calls it) and its arguments passed on to the post hooks.
Hook calls, what they see and the end state equal the torch step's."""

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from gigatron.core import parallel_state as ps
from gigatron.testing import run_distributed
from tests.core.optimizer.test_flat_adam_step import _build, _snapshot, _step

pytestmark = pytest.mark.multirank


DTYPE = torch.bfloat16


def _hooked_run(flat: bool):
    model, ddp, opt = _build(flat, DTYPE)
    inner = opt.optimizer
    first = inner.param_groups[0]["params"][0]  # a main param: updated by every step
    log = []

    def record(name):
        def hook(optimizer, args, kwargs):
            assert optimizer is inner and args[0] is inner, name
            state = inner.state[first]
            log.append(
                (
                    name,
                    len(args),
                    sorted(kwargs),
                    torch.is_grad_enabled(),
                    float(state.get("step", 0.0)),
                    first.detach().clone(),
                )
            )

        return hook

    def halve_lr(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            group["lr"] *= 0.5  # a hook's change must reach this step's update

    def closure():
        log.append(("closure", torch.is_grad_enabled()))

    def hand_closure(optimizer, args, kwargs):
        return args, {**kwargs, "closure": closure}

    handles = [
        register_optimizer_step_pre_hook(record("global_pre")),
        inner.register_step_pre_hook(halve_lr),
        inner.register_step_pre_hook(hand_closure),
        inner.register_step_pre_hook(record("pre")),
        inner.register_step_post_hook(record("post")),
        register_optimizer_step_post_hook(record("global_post")),
    ]
    try:
        for step in range(3):
            _step(model, ddp, opt, step, DTYPE)
    finally:
        for handle in handles:
            handle.remove()
    return log, _snapshot(model, opt)


def _compare():
    ps.initialize_model_parallel()
    return [_hooked_run(flat) for flat in (False, True)]


def test_flat_step_runs_the_torch_step_hooks():
    for (ref_log, ref), (flat_log, flat) in run_distributed(_compare, 2):
        names = [entry[0] for entry in ref_log]
        assert names == ["global_pre", "pre", "closure", "post", "global_post"] * 3
        assert [entry[0] for entry in flat_log] == names
        for a, b in zip(flat_log, ref_log, strict=True):
            assert a[:-1] == b[:-1], (a[:-1], b[:-1])  # name, arity, kwargs, grad mode, step
            if a[0] != "closure":
                # the main param each hook sees: before the update in pre hooks, after it in
                # post hooks (fp32 rounding order only)
                torch.testing.assert_close(a[-1], b[-1], rtol=2e-6, atol=1e-7, msg=a[0])
        pre, post = ref_log[1], ref_log[3]
        assert pre[:5] == ("pre", 1, ["closure"], False, 0.0) and post[4] == 1.0
        assert not torch.equal(pre[-1], post[-1])  # the update happened between them
        assert ref["step"] == flat["step"] == [3.0] * len(ref["step"])
        for name in ("main", "exp_avg", "exp_avg_sq"):
            for a, b in zip(flat[name], ref[name], strict=True):
                err = ((a - b).abs().max() / b.abs().max()).item()
                assert err <= 2e-6, (name, err)
