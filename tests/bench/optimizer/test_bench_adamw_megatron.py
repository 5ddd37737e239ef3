"""bench/optimizer/bench_adamw.py's timing of gigatron's training optimizer (`megatron_step`): on
CPU (gloo, one rank) the step it times is the real one: it moves the bf16 params, reports the grad
norm of the random fp32 grad buffers, and both optimizer kinds (and the distributed one's flat step)
give the same params."""

import pytest
import torch

from bench.optimizer import bench_adamw
from gigatron.core import parallel_state
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _steps():
    parallel_state.initialize_model_parallel()
    shapes = [(12, 4), (12,), (4, 4), (4,)]
    out = {}
    for distributed, flat in ((False, False), (True, False), (True, True)):
        torch.manual_seed(0)
        step, ddp = bench_adamw.megatron_step(shapes, "cpu", distributed, flat)
        before = [p.detach().clone() for p in ddp.module.parameters()]
        grads = [p.main_grad.view(-1) for p in ddp.module.parameters()]  # not the padding
        grad_norm = torch.cat(grads).norm().item()
        ok, norm, _ = step()
        step()
        after = [p.detach().clone() for p in ddp.module.parameters()]
        assert all(p.dtype == torch.bfloat16 for p in after)
        assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
        out[(distributed, flat)] = (ok, norm, grad_norm, after)
    return out


def test_megatron_step_runs_both_optimizer_kinds():
    (out,) = run_distributed(_steps, 1)
    for ok, norm, grad_norm, _ in out.values():
        assert ok and abs(norm - grad_norm) <= 1e-5 * grad_norm, (norm, grad_norm)
    for a, b, c in zip(*(out[k][3] for k in out), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(c, b, rtol=2**-7, atol=0)  # flat: bf16 rounding ties only
