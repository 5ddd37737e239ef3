"""The SDPA fast path equals DotProductAttention (forward and backward) for causal and explicit
masks, MHA and GQA; DotProductAttention itself matches a hand-written softmax attention."""

import math

import pytest
import torch

from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

SQ, B, NP, HN = 8, 2, 4, 8


gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


def _config(num_query_groups, **kw):
    return TransformerConfig(
        num_layers=2,
        hidden_size=NP * HN,
        num_attention_heads=NP,
        num_query_groups=num_query_groups,
        **{"attention_dropout": 0.0, **kw},
    )


def _inputs(ng, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(SQ, B, NP, HN, generator=g, requires_grad=True)
    k = torch.randn(SQ, B, ng, HN, generator=g, requires_grad=True)
    v = torch.randn(SQ, B, ng, HN, generator=g, requires_grad=True)
    return q, k, v


def _run(module, q, k, v, mask, grad_out):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, mask)
    out.backward(grad_out)
    return out, q.grad, k.grad, v.grad


def _naive(q, k, v, mask):
    """softmax(q.k / sqrt(hn) masked) . v per head, K/V heads shared by consecutive q heads."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(q.shape[0], B, -1)


@pytest.mark.parametrize("ng", [NP, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("mask_kind", ["causal", "explicit"])
def test_sdpa_matches_reference_forward_and_backward(ng, mask_kind):
    config = _config(ng)
    mask_type = AttnMaskType.causal if mask_kind == "causal" else AttnMaskType.padding
    ref = DotProductAttention(config, 1, mask_type)
    fast = SDPADotProductAttention(config, 1, mask_type)
    q, k, v = _inputs(ng)
    mask = None
    if mask_kind == "explicit":  # padding-style mask, True = masked, never a fully masked row
        mask = torch.rand(B, 1, SQ, SQ, generator=torch.Generator().manual_seed(3)) > 0.6
        mask[..., 0] = False
    grad_out = torch.randn(SQ, B, NP * HN)
    for a, b in zip(_run(ref, q, k, v, mask, grad_out), _run(fast, q, k, v, mask, grad_out)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    full_mask = mask if mask is not None else torch.ones(SQ, SQ, dtype=torch.bool).triu(1)
    with torch.no_grad():
        torch.testing.assert_close(
            ref(q, k, v, mask), _naive(q, k, v, full_mask), atol=1e-5, rtol=0
        )


def test_softmax_scale_and_query_key_layer_scaling():
    q, k, v = _inputs(NP)
    base = DotProductAttention(_config(NP, softmax_scale=0.3), 3, AttnMaskType.causal)
    fast = SDPADotProductAttention(_config(NP, softmax_scale=0.3), 3, AttnMaskType.causal)
    with torch.no_grad():
        torch.testing.assert_close(base(q, k, v, None), fast(q, k, v, None), atol=1e-5, rtol=0)
        plain = DotProductAttention(_config(NP), 3, AttnMaskType.causal)(q, k, v, None)
        scaled = DotProductAttention(
            _config(NP, apply_query_key_layer_scaling=True), 3, AttnMaskType.causal
        )
        assert scaled.softmax_scale == pytest.approx(1 / math.sqrt(HN) / 3)
        torch.testing.assert_close(scaled(q, k, v, None), plain, atol=1e-6, rtol=0)
        assert not torch.allclose(base(q, k, v, None), plain)


def test_attention_dropout_is_applied_in_training():
    config = _config(NP, attention_dropout=0.5)
    module = DotProductAttention(config, 1, AttnMaskType.causal)
    q, k, v = _inputs(NP)
    with torch.no_grad():
        module.eval()
        clean = module(q, k, v, None)
        module.train()
        from gigatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(7)
        noisy = module(q, k, v, None)
    assert not torch.allclose(clean, noisy)
