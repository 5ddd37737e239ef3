"""Sliding-window masks (Megatron's (left, right) window, -1 unbounded, queries aligned
bottom-right), logit soft-capping, and DotProductAttention's window layers: a decoded query
(sq = 1 < sk) sees the same window as in the full sequence; global layers see everything."""

import pytest
import torch

from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.utils import get_sliding_window_causal_mask, logit_softcapping
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)


def test_window_mask_keeps_left_keys_and_the_query():
    visible = ~get_sliding_window_causal_mask(5, 5, (2, 0))
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                             [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)  # fmt: skip
    assert torch.equal(visible, expected)
    assert not get_sliding_window_causal_mask(4, 4, (-1, -1)).any()  # unbounded both sides
    assert torch.equal(get_sliding_window_causal_mask(1, 5, (2, 0)), expected[-1:].logical_not())


def test_logit_softcapping_bounds_and_identity():
    x = torch.tensor([-100.0, -1.0, 0.0, 1.0, 100.0])
    torch.testing.assert_close(logit_softcapping(x, 5.0), 5.0 * torch.tanh(x / 5.0))
    assert logit_softcapping(x, 5.0).abs().max() <= 5.0
    assert logit_softcapping(x, None) is x


@pytest.mark.parametrize(("layer", "window"), [(1, True), (2, False)])
def test_decoded_query_sees_its_window(layer, window, single_rank):
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=2, attention_dropout=0.0,
        window_size=(2, 0), window_attn_skip_freq=2, attn_logit_softcapping=1.5,
    )  # fmt: skip
    attn = DotProductAttention(config, layer, AttnMaskType.causal).eval()
    assert (attn.window_size is not None) == window
    q, k, v = (torch.randn(6, 1, 2, 8) for _ in range(3))
    full = attn(q, k, v, None)  # [6, 1, 16]
    last = attn(q[-1:], k, v, None)  # one decoded query against the whole cache
    torch.testing.assert_close(last, full[-1:], rtol=0, atol=1e-6)
    # keys outside the window do not matter on the window layer, and do on the global one
    k2, v2 = k.clone(), v.clone()
    k2[:3], v2[:3] = torch.randn(3, 1, 2, 8), torch.randn(3, 1, 2, 8)
    changed = not torch.allclose(attn(q[-1:], k2, v2, None), last)
    assert changed != window
