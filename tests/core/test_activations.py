"""megatron.core.activations names: squared_relu, quick_gelu, fast_gelu."""

import torch
import torch.nn.functional as F

from gigatron.core.activations import fast_gelu, quick_gelu, squared_relu


def test_squared_relu_values():
    x = torch.tensor([-2.0, 0.0, 3.0])
    torch.testing.assert_close(squared_relu(x), torch.tensor([0.0, 0.0, 9.0]))


def test_quick_gelu_is_x_sigmoid_1702x():
    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(quick_gelu(x), x * torch.sigmoid(1.702 * x))


def test_fast_gelu_matches_torch_tanh_gelu():
    x = torch.linspace(-4, 4, 33)
    torch.testing.assert_close(fast_gelu(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
