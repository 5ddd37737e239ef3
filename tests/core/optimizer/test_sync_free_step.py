"""`step()` under `OptimizerConfig.sync_free_step`: the clipping norm kept on the device, clipping
and the skip of a NaN/Inf step done by torch's fused Adam(W) kernel (`grad_scale` /
`found_inf`); `update_successful` and the norm returned as 0-dim device tensors. Against
`step(check_grad_norm=True)` with the same fused kernel: the same updates up to fp32 rounding
(the clip coefficient applied as a divisor), the norm as a 0-dim tensor; a NaN / Inf / overflowing
norm changes nothing (params, main params, Adam moments and step counts), for the fp32, bf16,
chained and distributed optimizers and the flat Adam step (flat_adam_step=True,
which takes the coefficient and the skip flag into its pass; its host-side step counts advance on
a skipped step); what it cannot run with is refused by name. (On CPU gigatron
builds the unfused kernel: the tests switch the param groups to `fused`, which CPU supports.)"""

import math

import pytest
import torch

from tests._one_rank import one_rank_fixtures
from tests.core.optimizer.test_grad_norm_check import (
    _backward,
    _build,
    _huge,
    _inf_one,
    _nan_one,
    _state,
)

gloo_world, single_rank = one_rank_fixtures()

KINDS = ["fp32", "bf16", "chained", "distributed", "distributed-flat"]


def _step_on_device(opt):
    """(grad_norm, nonfinite) of the sync-free `step()`: 0-dim device tensors."""
    ok, norm, zeros = opt.step()
    assert zeros is None and ok.dim() == 0 and ok.dtype == torch.bool
    return norm, ~ok


def _fused(opt):
    for inner in getattr(opt, "chained_optimizers", [opt]):
        for group in inner.optimizer.param_groups:
            group["fused"] = True
        inner.optimizer.defaults["fused"] = True
    return opt


@pytest.mark.parametrize("kind", KINDS)
def test_same_updates_as_the_host_checked_step(kind):
    a, chunk_a, opt_a = _build(kind)
    b, chunk_b, opt_b = _build(kind, sync_free=True)
    _fused(opt_a), _fused(opt_b)
    for step in range(3):
        _backward(a, chunk_a, opt_a, step)
        _backward(b, chunk_b, opt_b, step)
        ok, norm_a, _ = opt_a.step(check_grad_norm=True)
        norm_b, nonfinite = _step_on_device(opt_b)
        assert ok and not bool(nonfinite) and norm_a > 0.05  # clipping active
        assert norm_b.dim() == 0 and norm_b.dtype == torch.float32
        assert float(norm_b) == pytest.approx(norm_a, rel=1e-6)
    for x, y in zip(_state(a, opt_a), _state(b, opt_b), strict=True):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("poison, want", [(_nan_one, "nan"), (_inf_one, "inf"), (_huge, "inf")])
def test_nonfinite_norm_skips_the_update_on_the_device(kind, poison, want):
    model, chunk, opt = _build_again(kind)
    _backward(model, chunk, opt, 0)
    assert not bool(_step_on_device(opt)[1])  # a good step first: Adam state exists
    before = _state(model, opt)
    _backward(model, chunk, opt, 1, poison=poison)
    norm, nonfinite = _step_on_device(opt)
    assert bool(nonfinite)
    assert math.isnan(float(norm)) if want == "nan" else float(norm) == math.inf
    after = _state(model, opt)
    assert len(after) == len(before)
    for x, y in zip(before, after):
        if kind == "distributed-flat" and x.dim() == 0:  # its step counts live on the host
            assert float(y) == float(x) + 1  # and advance (the loop stops at the log line)
            continue
        assert torch.equal(x, y)
    _backward(model, chunk, opt, 2)  # the next good step runs
    norm, nonfinite = _step_on_device(opt)
    assert not bool(nonfinite) and math.isfinite(float(norm))


def _build_again(kind):
    model, chunk, opt = _build(kind, sync_free=True)
    return model, chunk, _fused(opt)


def test_refusals_name_the_rule():
    model, chunk, opt = _build("bf16")
    opt.config.sync_free_step = True  # after the build: an unfused kernel on CPU
    with pytest.raises(ValueError, match="needs the fused Adam"):
        opt.step()
    _fused(opt)
    opt.config.clip_grad = 0.0
    with pytest.raises(ValueError, match=r"needs clip_grad > 0 \(got 0.0\)"):
        opt.step()
