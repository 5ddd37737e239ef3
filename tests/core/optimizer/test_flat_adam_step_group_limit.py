"""The flat Adam step's limit of 254 param groups (uint8 group ids) is one of the rules
`flat_step_wanted` checks: by default (CUDA) an optimizer with more groups takes torch's step
instead of failing in FlatAdamStep's constructor; forced (OptimizerConfig.flat_adam_step=True) the
error names the count."""

from types import SimpleNamespace

import pytest
import torch

from gigatron.core.optimizer import _flat_adam_step as flat


def _opt(num_groups: int):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(num_groups)]
    inner = torch.optim.AdamW(groups, lr=1e-3)
    buffers = [SimpleNamespace(grad_dtype=torch.float32)]
    config = SimpleNamespace(flat_adam_step=None)
    return SimpleNamespace(optimizer=inner, grad_scaler=None, buffers=buffers, config=config)


def test_too_many_param_groups_fall_back_by_default(monkeypatch):
    monkeypatch.setattr(flat, "_all_on_gpu", lambda dist_opt: True)
    assert flat.flat_step_wanted(_opt(254))
    assert not flat.flat_step_wanted(_opt(255))
    with pytest.raises(ValueError, match=r"255 param groups \(at most 254\)"):
        flat._check(_opt(255))
