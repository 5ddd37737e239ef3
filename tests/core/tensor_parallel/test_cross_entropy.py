"""vocab_parallel_cross_entropy on 1, 2 and 4 gloo ranks against F.cross_entropy on the full
logits (loss and logits grad, with and without label smoothing), the caller's logits left
untouched, 2 all-reduces forward / none backward, and Megatron's own result as an oracle."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel import vocab_parallel_cross_entropy
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import count_collectives

pytestmark = pytest.mark.multirank


S, B, V = 6, 2, 32
TOL = dict(rtol=1e-6, atol=1e-6)


def _data():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(S, B, V, generator=gen) * 3
    target = torch.randint(0, V, (S, B), generator=gen)
    grad = torch.rand(S, B, generator=gen)
    return logits, target, grad


def _reference(logits, target, grad, alpha):
    """F.cross_entropy with Megatron's rescaled smoothing alpha * V / (V - 1)."""
    x = logits.clone().requires_grad_(True)
    smoothing = alpha * V / (V - 1)
    loss = F.cross_entropy(
        x.view(-1, V), target.view(-1), reduction="none", label_smoothing=smoothing
    ).view(S, B)
    loss.backward(grad)
    return loss.detach(), x.grad


def _scaled_err(a, b):
    return ((a - b).abs() / (1 + b.abs())).max().item()


def _run_parity(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    logits, target, grad = _data()
    vocab = slice(rank * V // tp, (rank + 1) * V // tp)
    out = {}
    for alpha in (0.0, 0.1):
        want_loss, want_grad = _reference(logits, target, grad, alpha)
        shard = logits[..., vocab].clone().requires_grad_(True)
        before = shard.detach().clone()
        with count_collectives() as fwd:
            loss = vocab_parallel_cross_entropy(shard, target, label_smoothing=alpha)
        with count_collectives() as bwd:
            loss.backward(grad)
        assert torch.equal(shard.detach(), before), "logits were modified"
        assert loss.dtype == torch.float32 and loss.shape == (S, B)
        torch.testing.assert_close(loss, want_loss, **TOL)
        torch.testing.assert_close(shard.grad, want_grad[..., vocab], **TOL)
        err = max(_scaled_err(loss, want_loss), _scaled_err(shard.grad, want_grad[..., vocab]))
        out[alpha] = (err, dict(fwd), dict(bwd))
    return out


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_cross_entropy_parity(tp):
    for per_rank in run_distributed(_run_parity, tp, args=(tp,)):
        for alpha, (err, fwd, bwd) in per_rank.items():
            assert err <= 1e-6, (alpha, err)
            assert fwd == ({"all_reduce": 2} if tp > 1 else {}), (alpha, fwd)
            assert bwd == {}, (alpha, bwd)


def _run_low_precision(tp):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    logits, target, grad = _data()
    vocab = slice(rank * V // tp, (rank + 1) * V // tp)
    shard = logits[..., vocab].to(torch.bfloat16).requires_grad_(True)
    before = shard.detach().clone()
    loss = vocab_parallel_cross_entropy(shard, target)
    loss.backward(grad)
    assert torch.equal(shard.detach(), before)
    assert loss.dtype == torch.float32 and shard.grad.dtype == torch.bfloat16
    want_loss, _ = _reference(logits.to(torch.bfloat16).float(), target, grad, 0.0)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    return True


def test_cross_entropy_bf16_input():
    assert run_distributed(_run_low_precision, 2, args=(2,)) == [True, True]


def _run_errors():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    logits, target, _ = _data()
    with pytest.raises(ValueError, match=r"label_smoothing \(1.5\)"):
        vocab_parallel_cross_entropy(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match="target shape"):
        vocab_parallel_cross_entropy(logits, target[:2])
    return True


def test_cross_entropy_errors():
    assert run_distributed(_run_errors, 1) == [True]


def _compare_with_megatron(tp, alpha):
    from megatron.core import parallel_state as mps
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy as mce

    mps.initialize_model_parallel(tensor_model_parallel_size=tp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        rank = parallel_state.get_tensor_model_parallel_rank()
        logits, target, grad = _data()
        vocab = slice(rank * V // tp, (rank + 1) * V // tp)
        theirs_in = logits[..., vocab].clone().requires_grad_(True)
        theirs = mce(theirs_in * 1.0, target, alpha)  # "* 1.0": Megatron writes into its input
        theirs.backward(grad)
        ours_in = logits[..., vocab].clone().requires_grad_(True)
        ours = vocab_parallel_cross_entropy(ours_in, target, alpha)
        ours.backward(grad)
        torch.testing.assert_close(ours, theirs, **TOL)
        torch.testing.assert_close(ours_in.grad, theirs_in.grad, **TOL)
    finally:
        mps.destroy_model_parallel()
        parallel_state.destroy_model_parallel()


def _run_megatron_oracle():
    _compare_with_megatron(2, 0.0)
    # Label smoothing only at TP=1: Megatron's smoothing at TP>1 uses the local shard.
    _compare_with_megatron(1, 0.0)
    _compare_with_megatron(1, 0.1)
    return True


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
def test_matches_megatron():
    """Same loss and grads as megatron.core's own function (installed megatron-core)."""
    assert run_distributed(_run_megatron_oracle, 2) == [True, True]
