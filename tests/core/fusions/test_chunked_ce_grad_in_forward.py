"""Chunked cross entropy with grad_in_forward=True (both gradients computed in forward, scaled
in backward) against the plain path: fp32 on CPU, 1 and 2 gloo ranks (± sequence parallel),
masked and unmasked, and the checks of its contract (gradient proportional to the loss mask)."""

import pytest
import torch

from gigatron.core.fusions.chunked_cross_entropy import chunked_linear_cross_entropy
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _plain(hidden, weight, labels):
    logits = torch.matmul(hidden, weight.t()).float()  # [s, b, V]
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.t().reshape(-1), reduction="none"
    )
    return loss.view(labels.t().shape).t().contiguous()  # [b, s]


def _case(s, b, h, vocab, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(s, b, h, generator=g).to(device, dtype)
    weight = (torch.randn(vocab, h, generator=g) * h**-0.5).to(device, dtype)
    labels = torch.randint(0, vocab, (b, s), generator=g).to(device)
    mask = (torch.rand(b, s, generator=g) > 0.3).float().to(device)
    return hidden, weight, labels, mask


def _plain_and_fused(hidden, weight, labels, mask, pass_mask=True, **kw):
    """[(loss, dX, dW) of the plain path, the same of grad_in_forward] under the masked mean."""
    out = []
    for fused in (False, True):
        x = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        if fused:
            loss = chunked_linear_cross_entropy(
                x, w, labels, grad_in_forward=True, loss_mask=mask if pass_mask else None, **kw
            )
        else:
            loss = _plain(x, w, labels)
        _masked_mean(loss, mask).backward()
        out.append((loss.detach(), x.grad, w.grad))
    return out


def _masked_mean(loss, mask):
    """Megatron's loss_func: sum of masked per-token losses over the token count, scaled."""
    return 3.0 * (loss * mask).sum() / mask.sum()


@pytest.mark.parametrize("chunk_size", [5, 16, 1000])
@pytest.mark.parametrize("masked", [False, True])
def test_grad_in_forward_matches_plain(chunk_size, masked):
    hidden, weight, labels, mask = _case(8, 3, 16, 50)
    if not masked:
        mask = torch.ones_like(mask)
    grads = _plain_and_fused(hidden, weight, labels, mask, masked, chunk_size=chunk_size)
    (l0, dx0, dw0), (l1, dx1, dw1) = grads
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx1, dx0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw1, dw0, rtol=1e-5, atol=1e-6)
    assert dw1.abs().max() > 1e-3  # the check compares real gradients


def test_grad_not_proportional_to_mask_raises():
    hidden, weight, labels, mask = _case(6, 2, 8, 20)
    x = hidden.clone().requires_grad_()
    loss = chunked_linear_cross_entropy(x, weight, labels, grad_in_forward=True, loss_mask=mask)
    per_token = torch.rand(loss.shape)  # not a masked mean: g is not a * mask
    with pytest.raises(RuntimeError, match="proportional to loss_mask"):
        (loss * per_token).sum().backward()


def test_no_grad_forward_is_the_loss_only():
    hidden, weight, labels, mask = _case(6, 2, 8, 20)
    with torch.no_grad():
        got = chunked_linear_cross_entropy(hidden, weight, labels, grad_in_forward=True)
    torch.testing.assert_close(got, _plain(hidden, weight, labels), rtol=1e-5, atol=1e-6)


def test_bad_loss_mask_shape():
    hidden, weight, labels, mask = _case(4, 2, 8, 10)
    with pytest.raises(ValueError, match="loss_mask shape"):
        chunked_linear_cross_entropy(
            hidden, weight, labels, grad_in_forward=True, loss_mask=mask.t()
        )


def test_config_accepts_native_impls_and_refuses_te():
    from gigatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(num_layers=1, hidden_size=16, num_attention_heads=2)
    impl = TransformerConfig(
        **kw, cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native_grad_in_forward"
    )
    assert impl.cross_entropy_fusion_impl == "native_grad_in_forward"
    with pytest.raises(ValueError, match="needs cross_entropy_loss_fusion=True"):
        TransformerConfig(**kw, cross_entropy_fusion_impl="native_grad_in_forward")
    with pytest.raises(ValueError, match="cross_entropy_fusion_impl='te'"):
        TransformerConfig(**kw, cross_entropy_fusion_impl="te")


def test_only_the_needed_gradient_is_computed():
    """A frozen output weight: forward computes dX only (and dX matches the plain path)."""
    hidden, weight, labels, mask = _case(6, 2, 8, 20)
    x = hidden.clone().requires_grad_()
    loss = chunked_linear_cross_entropy(x, weight, labels, grad_in_forward=True, loss_mask=mask)
    _masked_mean(loss, mask).backward()
    assert weight.grad is None
    x_ref = hidden.clone().requires_grad_()
    _masked_mean(_plain(x_ref, weight, labels), mask).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


def _tp_worker(sequence_parallel):
    import torch.distributed as dist

    from gigatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    s, b, h, vocab = 8, 2, 16, 40
    hidden, weight, labels, mask = _case(s, b, h, vocab, seed=3)
    x_ref = hidden.clone().requires_grad_()
    w_ref = weight.clone().requires_grad_()
    ref = _plain(x_ref, w_ref, labels)
    _masked_mean(ref, mask).backward()
    w = weight[rank * vocab // 2 : (rank + 1) * vocab // 2].clone().requires_grad_()
    x_in = hidden[rank * s // 2 : (rank + 1) * s // 2] if sequence_parallel else hidden
    x = x_in.clone().requires_grad_()
    loss = chunked_linear_cross_entropy(
        x,
        w,
        labels,
        chunk_size=6,
        sequence_parallel=sequence_parallel,
        grad_in_forward=True,
        loss_mask=mask,
    )
    _masked_mean(loss, mask).backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6)
    ref_dx = x_ref.grad[rank * s // 2 : (rank + 1) * s // 2] if sequence_parallel else x_ref.grad
    torch.testing.assert_close(x.grad, ref_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        w.grad, w_ref.grad[rank * vocab // 2 : (rank + 1) * vocab // 2], rtol=1e-5, atol=1e-6
    )
    return float(loss.detach().sum())


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_grad_in_forward_tp2_matches_unsharded(sequence_parallel):
    results = run_distributed(_tp_worker, 2, args=(sequence_parallel,), timeout=120)
    assert results[0] == pytest.approx(results[1])


@pytest.mark.gpu
def test_grad_in_forward_cuda_bf16_compiled():
    """bf16 on CUDA with the compiled helpers: the plain path's numbers, the contract check
    passes for a masked mean (no device assert), and no full-batch fp32 logits are kept."""
    s, b, h, vocab = 512, 4, 256, 8192
    hidden, weight, labels, mask = _case(s, b, h, vocab, device="cuda", dtype=torch.bfloat16)
    grads = _plain_and_fused(hidden, weight, labels, mask, chunk_size=700, compiled=True)
    torch.cuda.synchronize()  # a failed contract check would surface here
    (l0, dx0, dw0), (l1, dx1, dw1) = grads
    torch.testing.assert_close(l1, l0, rtol=2e-3, atol=2e-3)
    for got, want in ((dx1, dx0), (dw1, dw0)):
        rel = (got.float() - want.float()).norm() / want.float().norm()
        assert rel < 1e-2, f"relative error {rel:.2e}"
    x = hidden.clone().requires_grad_()
    kw = dict(chunk_size=256, grad_in_forward=True, loss_mask=mask)
    _masked_mean(chunked_linear_cross_entropy(x, weight, labels, **kw), mask).backward()
    torch.cuda.synchronize()
    x.grad = None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _masked_mean(chunked_linear_cross_entropy(x, weight, labels, **kw), mask).backward()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 4 * s * b * vocab  # under the fp32 logits of the whole batch
