"""Adam's step count after a dist_checkpointing optimizer load (and the zero state made before
one) lives where torch keeps it: on the param's device for a fused / capturable group (the fused
CUDA kernel dereferences it there), a CPU scalar otherwise. A resume builds a fresh optimizer, so
the zero state `_ensure_state` makes is what the load fills: it was always a CPU scalar. The
meta device stands in for CUDA on CPU; the GPU test steps torch's fused Adam after the load."""

from __future__ import annotations

import pytest
import torch

from gigatron.core.dist_checkpointing.optimizer import _ensure_state, load_optimizer_state_dict


def _opt(device, **kw):
    params = [torch.nn.Parameter(torch.ones(4, device=device))]
    return torch.optim.AdamW(params, lr=0.1, **kw)


@pytest.mark.parametrize("flag", ["fused", "capturable"])
def test_fused_group_step_on_param_device(flag):
    opt = _opt("meta", **{flag: True})
    (p,) = opt.param_groups[0]["params"]
    state = _ensure_state(opt, p)
    assert state["step"].device == p.device and state["step"].dtype == torch.float32
    load_optimizer_state_dict(opt, {"sharded": {}}, {"common": {"step": 5.0}})
    step = opt.state[p]["step"]
    assert step.device == p.device and step.dtype == torch.float32


def test_plain_group_step_on_host():
    opt = _opt("cpu")
    (p,) = opt.param_groups[0]["params"]
    _ensure_state(opt, p)
    load_optimizer_state_dict(opt, {"sharded": {}}, {"common": {"step": 5.0}})
    step = opt.state[p]["step"]
    assert step.device.type == "cpu" and float(step) == 5.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_cuda_resume_steps_like_uninterrupted():
    torch.manual_seed(0)
    w0 = torch.randn(64, device="cuda")
    grads = [torch.randn(64, device="cuda") for _ in range(4)]

    def run(opt, gs):
        for g in gs:
            opt.param_groups[0]["params"][0].grad = g.clone()
            opt.step()

    ref = torch.optim.AdamW([torch.nn.Parameter(w0.clone())], lr=0.1, fused=True)
    run(ref, grads)
    first = torch.optim.AdamW([torch.nn.Parameter(w0.clone())], lr=0.1, fused=True)
    run(first, grads[:2])
    (p1,) = first.param_groups[0]["params"]
    # the resumed run: a fresh optimizer, its zero state filled by the load
    fresh = torch.optim.AdamW([torch.nn.Parameter(p1.detach().clone())], lr=0.1, fused=True)
    (p2,) = fresh.param_groups[0]["params"]
    state = _ensure_state(fresh, p2)
    state["exp_avg"].copy_(first.state[p1]["exp_avg"])
    state["exp_avg_sq"].copy_(first.state[p1]["exp_avg_sq"])
    load_optimizer_state_dict(fresh, {"sharded": {}}, {"common": {"step": 2.0}})
    assert fresh.state[p2]["step"].is_cuda
    run(fresh, grads[2:])
    torch.cuda.synchronize()
    torch.testing.assert_close(p2, ref.param_groups[0]["params"][0], rtol=0, atol=0)


def test_load_keeps_this_process_kernel_flags():
    """The checkpoint's hyperparameters are restored, its kernel choice is not: a CPU-saved
    fused=False must not turn a fused (GPU) optimizer into the foreach one."""
    opt = _opt("meta", fused=True)
    (p,) = opt.param_groups[0]["params"]
    _ensure_state(opt, p)
    saved = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    saved.update(lr=0.5, fused=False, foreach=True)
    load_optimizer_state_dict(
        opt, {"sharded": {}}, {"common": {"step": 3.0, "param_groups": [saved]}}
    )
    group = opt.param_groups[0]
    assert group["lr"] == 0.5 and group["fused"] and not group["foreach"]
    assert opt.state[p]["step"].device == p.device
