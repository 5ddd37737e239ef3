"""weighted_squared_relu_impl: squared_relu(x) * per-token weight, with its gradients."""

import pytest
import torch

from gigatron.core.activations import squared_relu
from gigatron.core.fusions.fused_weighted_squared_relu import weighted_squared_relu_impl


@pytest.mark.parametrize("shape", [(6, 8), (3, 2, 8)])
def test_values_and_grads_match_unfused(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    w = torch.randn(6, 1, requires_grad=True)
    g = torch.randn(*shape)
    ref = (squared_relu(x.reshape(6, 8)) * w).view(shape)
    ref.backward(g)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = weighted_squared_relu_impl(x2, w2)
    out.backward(g)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(w2.grad, w.grad)


def test_bf16_input_keeps_its_dtype_with_fp32_weights():
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(4, 1, requires_grad=True)
    out = weighted_squared_relu_impl(x, w)
    out.sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert w.grad.dtype == torch.float32


def test_rejects_4d_input():
    with pytest.raises(ValueError, match="2-D or 3-D"):
        weighted_squared_relu_impl(torch.zeros(1, 2, 3, 4), torch.zeros(6, 1))
