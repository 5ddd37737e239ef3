"""CheckpointWithoutOutputManager: chained checkpoints freed and recomputed from one hook."""

import pytest
import torch

from gigatron.core.tensor_parallel.random import (
    CheckpointWithoutOutput,
    CheckpointWithoutOutputManager,
)


def _chain(x, manager):
    """y1 = sin(x); y2 = y1 * 3 (both checkpointed); out = (y2 ** 2).sum()."""
    c1 = CheckpointWithoutOutput(ckpt_manager=manager)
    y1 = c1.checkpoint(torch.sin, x)
    c2 = CheckpointWithoutOutput(ckpt_manager=manager)
    y2 = c2.checkpoint(lambda t: t * 3.0, y1)
    z = y2 * y2
    return z, (y1, y2)


def test_manager_recomputes_chained_outputs_and_grads_match_plain():
    x = torch.randn(4, 8, requires_grad=True)
    expected = torch.autograd.grad((torch.sin(x) * 3.0).pow(2).sum(), x)[0]

    manager = CheckpointWithoutOutputManager()
    z, (y1, y2) = _chain(x, manager)
    assert len(manager.checkpoints) == 2
    manager.discard_all_outputs_and_register_unified_recompute(z)
    assert y1.untyped_storage().size() == 0 and y2.untyped_storage().size() == 0
    z.sum().backward()
    torch.testing.assert_close(x.grad, expected)


def test_under_a_manager_the_per_checkpoint_discard_does_nothing():
    manager = CheckpointWithoutOutputManager()
    x = torch.randn(3, requires_grad=True)
    ckpt = CheckpointWithoutOutput(ckpt_manager=manager)
    y = ckpt.checkpoint(torch.exp, x)
    ckpt.discard_output_and_register_recompute(y * 2)
    assert y.untyped_storage().size() > 0


def test_retain_input_tensors_keeps_an_output_that_aliases_an_input():
    x = torch.randn(5, requires_grad=True)
    ckpt = CheckpointWithoutOutput(retain_input_tensors=True)
    a, b = ckpt.checkpoint(lambda t: (t.view(5), t * 2.0), x)
    out = (a * b).sum()
    ckpt.discard_output_and_register_recompute(out)
    assert a.untyped_storage().size() > 0  # aliases x: kept
    assert b.untyped_storage().size() == 0  # fresh tensor: freed
    out.backward()
    torch.testing.assert_close(x.grad, 4.0 * x.detach())


def test_add_checkpoint_rejects_wrong_type_and_unrun_checkpoint():
    manager = CheckpointWithoutOutputManager()
    with pytest.raises(TypeError, match="CheckpointWithoutOutput"):
        manager.add_checkpoint(object())
    with pytest.raises(ValueError, match="checkpoint\\(\\)"):
        manager.add_checkpoint(CheckpointWithoutOutput())
