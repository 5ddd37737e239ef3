"""Megatron's fusion entry points (bias-dropout-add, SwiGLU, masked softmax) against plain math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.fusions.fused_bias_dropout import _bias_dropout_add_func, get_bias_dropout_add
from gigatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl, weighted_bias_swiglu_impl
from gigatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.utils import attention_mask_func


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_bias_dropout_add_keeps_an_fp32_residual(fused, training):
    x, bias = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16)
    residual = torch.randn(4, 8)
    out = get_bias_dropout_add(training, fused)((x, bias), residual, 0.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, residual + x.float() + bias.float())


def test_bias_dropout_add_in_place_only_in_eval_without_grads():
    x, residual, bias = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8)
    expected = residual + x + bias
    out = _bias_dropout_add_func((x, bias), residual, 0.0, False)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(out, expected)
    x = torch.randn(4, 8, requires_grad=True)
    out = _bias_dropout_add_func((x, None), residual, 0.0, False)
    assert out.data_ptr() != x.data_ptr()


def test_bias_dropout_add_drops_in_training():
    torch.manual_seed(0)
    out = _bias_dropout_add_func((torch.ones(1000), None), torch.zeros(1000), 0.5, True)
    assert set(out.unique().tolist()) == {0.0, 2.0}


def _swiglu_ref(x, bias=None, weights=None, clamp=None):
    y = x if bias is None else x + bias
    a, b = y.chunk(2, -1)
    if clamp is not None:  # computed in FP32, as Megatron does
        a, b = a.float().clamp(max=clamp), b.float().clamp(-clamp, clamp)
    out = F.silu(a) * b
    return (out if weights is None else out * weights).to(x.dtype)


@pytest.mark.parametrize("shape", [(6, 8), (3, 2, 8)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("clamp", [None, 0.5])
def test_bias_swiglu_matches_plain_math_and_gradients(shape, with_bias, clamp):
    x = (torch.randn(*shape, dtype=torch.float64) * 2).requires_grad_(True)
    bias = torch.randn(8, dtype=torch.float64, requires_grad=True) if with_bias else None
    out = bias_swiglu_impl(x, bias, clamp_value=clamp)
    assert out.shape == (*shape[:-1], 4)
    torch.testing.assert_close(out, _swiglu_ref(x, bias, clamp=clamp))
    g = torch.randn(out.shape, dtype=out.dtype)
    grads = torch.autograd.grad(out, [t for t in (x, bias) if t is not None], g)
    ref = _swiglu_ref(x, bias, clamp=clamp)
    torch.testing.assert_close(
        grads, torch.autograd.grad(ref, [t for t in (x, bias) if t is not None], g)
    )
    if clamp is None:  # the clamped form computes in FP32, like Megatron's
        assert torch.autograd.gradcheck(bias_swiglu_impl, (x, bias))


def test_weighted_swiglu_gradients_and_dtype():
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 1, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(weighted_bias_swiglu_impl(x, None, w), _swiglu_ref(x, weights=w))
    assert torch.autograd.gradcheck(lambda a, b: weighted_bias_swiglu_impl(a, None, b), (x, w))
    xb = torch.randn(6, 8, dtype=torch.bfloat16)
    assert weighted_bias_swiglu_impl(xb, None, torch.randn(6, 1)).dtype == torch.bfloat16
    with pytest.raises(NotImplementedError):
        weighted_bias_swiglu_impl(x, torch.zeros(8), w)


def test_swiglu_fp8_input_store_and_refusals():
    x = torch.randn(6, 8, requires_grad=True)
    bias_swiglu_impl(x, None, fp8_input_store=True).sum().backward()
    x8 = x.detach().to(torch.float8_e4m3fn).float().requires_grad_(True)
    _swiglu_ref(x8).sum().backward()
    torch.testing.assert_close(x.grad, x8.grad)  # gradients from the FP8-rounded input
    with pytest.raises(ValueError, match="cpu_offload_input"):
        bias_swiglu_impl(x, None, cpu_offload_input=True)
    with pytest.raises(AssertionError, match="2 or 3 dimensions"):
        bias_swiglu_impl(torch.randn(8), None)


def _softmax(mask_type=AttnMaskType.causal, **kw):
    args = dict(input_in_fp16=False, input_in_bf16=False, attn_mask_type=mask_type,
                scaled_masked_softmax_fusion=True, mask_func=attention_mask_func,
                softmax_in_fp32=True, scale=None)  # fmt: skip
    return FusedScaleMaskSoftmax(**{**args, **kw})


def test_softmax_causal_mask_scale_and_dtype():
    x = torch.randn(2, 3, 5, 5, dtype=torch.bfloat16)
    out = _softmax(input_in_bf16=True, scale=0.5)(x, None)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    ref = torch.softmax((x.float() * 0.5).masked_fill(causal, -10000.0), -1).bfloat16()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)
    pad = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    pad[..., -1] = True
    out = _softmax(AttnMaskType.padding)(x.float(), pad)
    torch.testing.assert_close(out, torch.softmax(x.float().masked_fill(pad, -10000.0), -1))


def test_softmax_offset_and_sliding_window():
    x = torch.randn(1, 2, 3, 3)
    offset = torch.tensor([0.0, 1.0])
    out = _softmax(AttnMaskType.padding)(x, None, offset)
    e = x.exp()
    denom = e.sum(-1, keepdim=True) + offset.exp().reshape(1, 2, 1, 1)
    torch.testing.assert_close(out, e / denom)
    out = _softmax(window_size=(1, 0))(x, None)  # each query sees itself and one key before
    assert (out[..., 2, 0] < 1e-3).all() and (out[..., 0, 1:] < 1e-3).all()


def test_softmax_refuses_megatrons_assertions():
    with pytest.raises(AssertionError, match="sq == sk"):
        _softmax()(torch.randn(1, 1, 4, 16), None)
    with pytest.raises(AssertionError, match="b, np, sq, sk"):
        _softmax()(torch.randn(4, 4), None)
    with pytest.raises(AssertionError, match="both set"):
        _softmax(input_in_fp16=True, input_in_bf16=True)
    with pytest.raises(AssertionError, match="softmax_in_fp32"):
        _softmax(softmax_in_fp32=False, scale=2.0)
