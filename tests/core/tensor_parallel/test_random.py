"""RNG tracker, Megatron's seed offsets and activation checkpointing (single process; on CPU the
tracker drives the CPU generator, on CUDA the CUDA generator)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.tensor_parallel import (
    CheckpointWithoutOutput,
    checkpoint,
    get_cuda_rng_tracker,
    get_data_parallel_rng_tracker_name,
    get_expert_parallel_rng_tracker_name,
    model_parallel_cuda_manual_seed,
)
from gigatron.core.tensor_parallel.random import CudaRNGStatesTracker

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _expected(seed, n=5):
    return torch.randn(n, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(seed))


def test_fork_uses_named_streams_and_restores_default():
    tracker = CudaRNGStatesTracker()
    tracker.add("a", 10)
    tracker.add("b", 20)
    torch.manual_seed(0)
    default_first = torch.randn(5, device=DEVICE)
    torch.manual_seed(0)
    with tracker.fork("a"):
        a1 = torch.randn(5, device=DEVICE)
    with tracker.fork("b"):
        b1 = torch.randn(5, device=DEVICE)
    with tracker.fork("a"):
        a2 = torch.randn(5, device=DEVICE)
    # The default stream did not move while forked.
    assert torch.equal(torch.randn(5, device=DEVICE), default_first)
    torch.testing.assert_close(a1, _expected(10))
    torch.testing.assert_close(b1, _expected(20))
    # A fork continues its stream where the previous fork left it.
    gen = torch.Generator(DEVICE).manual_seed(10)
    torch.randn(5, device=DEVICE, generator=gen)
    torch.testing.assert_close(a2, torch.randn(5, device=DEVICE, generator=gen))
    assert not torch.equal(a1, b1)


def test_tracker_states_roundtrip_and_errors():
    tracker = CudaRNGStatesTracker()
    tracker.add("a", 1)
    saved = tracker.get_states()
    with tracker.fork("a"):
        first = torch.randn(3, device=DEVICE)
    tracker.set_states(saved)
    with tracker.fork("a"):
        assert torch.equal(torch.randn(3, device=DEVICE), first)
    with pytest.raises(ValueError, match="seed 1 already exists"):
        tracker.add("b", 1)
    with pytest.raises(ValueError, match="cuda rng state a already exists"):
        tracker.add("a", 2)
    with pytest.raises(ValueError, match="cuda rng state c is not added"):
        with tracker.fork("c"):
            pass
    tracker.reset()
    assert tracker.get_states() == {} and not tracker.is_initialized()


def test_model_parallel_cuda_manual_seed_offsets():
    seed = 1234
    model_parallel_cuda_manual_seed(seed, tp_rank=3, ep_rank=2, etp_rank=1)
    tracker = get_cuda_rng_tracker()
    assert set(tracker.get_states()) == {
        "model-parallel-rng",
        "expert-parallel-rng",
        "data-parallel-rng",
    }
    assert get_expert_parallel_rng_tracker_name() == "expert-parallel-rng"
    assert get_data_parallel_rng_tracker_name() == "data-parallel-rng"
    # The default generator is reset to `seed` (same on every TP rank).
    torch.testing.assert_close(torch.randn(5, device=DEVICE), _expected(seed))
    with tracker.fork():
        torch.testing.assert_close(torch.randn(5, device=DEVICE), _expected(seed + 2718 + 3))
    with tracker.fork("expert-parallel-rng"):
        torch.testing.assert_close(torch.randn(5, device=DEVICE), _expected(seed + 1024 + 201))
    with tracker.fork("data-parallel-rng"):
        torch.testing.assert_close(torch.randn(5, device=DEVICE), _expected(seed))
    # Calling it again resets the streams.
    model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0)
    with tracker.fork():
        torch.testing.assert_close(torch.randn(5, device=DEVICE), _expected(seed + 2718))


def test_unsupported_tracker_flags():
    with pytest.raises(ValueError, match="use_te_rng_tracker"):
        model_parallel_cuda_manual_seed(1, te_rng_tracker=True, tp_rank=0, ep_rank=0, etp_rank=0)


def _block(x, w):
    """Dropout on the default stream and on the model-parallel stream, as a TP layer would."""
    h = F.dropout(torch.tanh(x @ w), p=0.5, training=True)
    with get_cuda_rng_tracker().fork():
        h = F.dropout(h, p=0.3, training=True)
    return h @ w.t()


def _grads(use_checkpoint):
    model_parallel_cuda_manual_seed(7, tp_rank=0, ep_rank=0, etp_rank=0)
    torch.manual_seed(7)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=gen).to(DEVICE).requires_grad_(True)
    w = torch.randn(8, 8, generator=gen).to(DEVICE).requires_grad_(True)
    y = checkpoint(_block, False, x, w) if use_checkpoint else _block(x, w)
    after_forward = torch.randn(2, device=DEVICE)  # streams must continue identically
    (y * y).sum().backward()
    after_backward = torch.randn(2, device=DEVICE)
    return y.detach(), x.grad, w.grad, after_forward, after_backward


def test_checkpoint_recompute_replays_dropout():
    plain = _grads(False)
    ckpt = _grads(True)
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_checkpoint_rejects_autograd_grad():
    x = torch.randn(3, 4, requires_grad=True)
    y = checkpoint(lambda t: t.sin(), False, x)
    with pytest.raises(RuntimeError, match="not compatible with .grad"):
        torch.autograd.grad(y.sum(), x)


def test_checkpoint_with_non_tensor_args():
    x = torch.randn(3, 4, requires_grad=True)
    y = checkpoint(lambda t, scale, none: t.sin() * scale, False, x, 3.0, None)
    y.sum().backward()
    torch.testing.assert_close(x.grad, 3.0 * x.detach().cos())


def test_checkpoint_without_output():
    def act(t):
        return F.dropout(F.gelu(t), p=0.2, training=True)

    def run(use_ckpt):
        torch.manual_seed(3)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(4, 8, generator=gen).requires_grad_(True)
        w = torch.randn(8, 8, generator=gen).requires_grad_(True)
        if use_ckpt:
            ckpt = CheckpointWithoutOutput()
            y = ckpt.checkpoint(act, x)
            z = y @ w
            ckpt.discard_output_and_register_recompute(z)
            assert y.untyped_storage().size() == 0  # freed until backward needs it
        else:
            z = act(x) @ w
        z.pow(2).sum().backward()
        return x.grad, w.grad

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
