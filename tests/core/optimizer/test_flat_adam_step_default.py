"""When the distributed optimizer takes the flat Adam step (gigatron/core/optimizer/
_flat_adam_step.py `flat_step_wanted`): by default only with every main param on a GPU and an
optimizer that qualifies (Adam / AdamW, fp32 grad buffers, no loss scaler), silently the torch
step otherwise; OptimizerConfig.flat_adam_step=True forces it (a non-qualifying optimizer is an
error naming the rule), False turns it off, anything else is refused; the environment is not
read."""

from types import SimpleNamespace

import pytest
import torch

from gigatron.core.optimizer import _flat_adam_step as flat


def _opt(cls=torch.optim.AdamW, grad_dtype=torch.float32, scaler=None, mode=None):
    inner = cls([torch.nn.Parameter(torch.zeros(4))], lr=1e-3)
    buffers = [SimpleNamespace(grad_dtype=grad_dtype)]
    config = SimpleNamespace(flat_adam_step=mode)
    return SimpleNamespace(optimizer=inner, grad_scaler=scaler, buffers=buffers, config=config)


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(flat, "_all_on_gpu", lambda dist_opt: True)


def test_default_on_gpu_when_the_optimizer_qualifies(on_gpu):
    assert flat.flat_step_wanted(_opt())
    assert flat.flat_step_wanted(_opt(torch.optim.Adam))
    assert not flat.flat_step_wanted(_opt(torch.optim.SGD))
    assert not flat.flat_step_wanted(_opt(grad_dtype=torch.bfloat16))
    assert not flat.flat_step_wanted(_opt(scaler=object()))  # fp16's loss scaler


def test_default_off_on_cpu():
    assert not flat.flat_step_wanted(_opt())


def test_config_forces_or_disables(on_gpu, monkeypatch):
    monkeypatch.setenv("GIGATRON_FLAT_OPTIMIZER_STEP", "1")  # the retired switch: not read
    assert not flat.flat_step_wanted(_opt(mode=False))
    monkeypatch.setenv("GIGATRON_FLAT_OPTIMIZER_STEP", "0")
    assert flat.flat_step_wanted(_opt(torch.optim.SGD, mode=True))  # FlatAdamStep refuses it
    with pytest.raises(ValueError, match="needs torch.optim.Adam or AdamW"):
        flat._check(_opt(torch.optim.SGD, mode=True))
    from gigatron.core.optimizer import OptimizerConfig

    with pytest.raises(ValueError, match=r"flat_adam_step \('yes'\) must be None, False or True"):
        OptimizerConfig(lr=1e-3, flat_adam_step="yes")


def test_compile_failure_falls_back_to_eager(monkeypatch):
    """A first compiled call that fails (no Triton / compiler) warns and runs the eager update;
    later calls go straight to eager."""
    monkeypatch.setattr(flat, "_COMPILED", {})
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("no triton")

    update = flat._compiled_or_eager(broken)
    n = 8
    main, grad = torch.ones(n), torch.full((n,), 0.5)
    m, v = torch.zeros(n), torch.zeros(n)
    gid = torch.zeros(n, dtype=torch.uint8)
    table = torch.tensor([[1.0, 0.1, 1.0, 0.1, 0.999, 0.001, 1e-8, 0.0, 1.0]])
    with pytest.warns(UserWarning, match="torch.compile failed .*no triton.*eager update"):
        update(main, grad, m, v, gid, table, None)
    assert main[0] < 1.0 and m[0] > 0  # the eager update ran
    update(main, grad, m, v, gid, table, None)
    assert len(calls) == 1


def test_sync_free_skip_nan_steps_refuses_the_flat_step():
    """The flat step's host step counts advance on a skipped sync-free update: the loop refuses
    --sync-free-step + --skip-nan-steps with it (also inside a ChainedOptimizer), and
    lets torch's fused Adam (no flat step) or a stopping run through."""
    from gigatron.training._train_step import _check_sync_free_skips

    flat_opt, torch_opt = SimpleNamespace(_flat_step=object()), SimpleNamespace(_flat_step=None)
    skip, stop = SimpleNamespace(skip_nan_steps=True), SimpleNamespace(skip_nan_steps=False)
    chained = SimpleNamespace(chained_optimizers=[torch_opt, flat_opt])
    for opt in (flat_opt, chained):
        with pytest.raises(ValueError, match="--skip-nan-steps needs torch's fused Adam"):
            _check_sync_free_skips(opt, skip)
        _check_sync_free_skips(opt, stop)
    _check_sync_free_skips(torch_opt, skip)
