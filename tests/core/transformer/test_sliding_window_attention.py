"""Sliding-window attention (Megatron's `window_size` / `window_attn_skip_freq`): the one mask
rule, which layers get it, DotProductAttention against a hand-written windowed softmax (forward
and backward, with a KV cache's bottom-right alignment and packed documents), SDPA against
DotProductAttention, and the config's one-line errors."""

import math

import pytest
import torch

from gigatron.core.packed_seq_params import PackedSeqParams
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.utils import (
    get_sliding_window_causal_mask,
    is_layer_window_attention,
    sliding_window_mask,
)
from tests._one_rank import one_rank_fixtures

S, B, NP, HN = 10, 2, 4, 8

gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


def _config(**kw):
    base = dict(num_layers=4, hidden_size=NP * HN, num_attention_heads=NP, attention_dropout=0.0)
    return TransformerConfig(**{**base, **kw})


def _allowed(sq, sk, left, right):
    """The rule written out: query i (position sk - sq + i) sees key j iff
    pos - left <= j <= pos + right (a side of -1 unbounded)."""
    out = torch.zeros(sq, sk, dtype=torch.bool)
    for i in range(sq):
        p = sk - sq + i
        for j in range(sk):
            out[i, j] = (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
    return out


@pytest.mark.parametrize("window", [(3, 0), (0, 0), (2, 1), (-1, 0), (-1, -1), (4, -1)])
@pytest.mark.parametrize("sq_sk", [(6, 6), (2, 6), (1, 6)])
def test_window_mask_masks_keys_outside_left_right_band(window, sq_sk):
    sq, sk = sq_sk
    assert torch.equal(get_sliding_window_causal_mask(sq, sk, window), ~_allowed(sq, sk, *window))


def test_window_mask_uses_given_positions():
    q_pos, k_pos = torch.tensor([5, 9]), torch.tensor([0, 3, 5, 6, 9])
    got = sliding_window_mask(q_pos, k_pos, (2, 0))
    want = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(got, want)


def test_window_layers_follow_skip_freq_int_and_list():
    assert [is_layer_window_attention((4, 0), 2, n) for n in range(1, 5)] == [1, 0, 1, 0]
    assert [is_layer_window_attention((4, 0), None, n) for n in range(1, 5)] == [1, 1, 1, 1]
    pattern = [0, 1, 1, 0]
    assert [is_layer_window_attention((4, 0), pattern, n) for n in range(1, 5)] == pattern
    assert not is_layer_window_attention(None, 2, 1)
    cfg = _config(window_size=(3, 0), window_attn_skip_freq=3)
    windows = [DotProductAttention(cfg, n, AttnMaskType.causal).window_size for n in (1, 2, 3, 4)]
    assert windows == [(3, 0), (3, 0), None, (3, 0)]


def _inputs(ng, sq=S, sk=S, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sq, B, NP, HN, generator=g)
    k = torch.randn(sk, B, ng, HN, generator=g)
    v = torch.randn(sk, B, ng, HN, generator=g)
    return q, k, v


def _naive(q, k, v, allowed):
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(q.shape[0], B, -1)


def _fwd_bwd(fn, q, k, v):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(torch.ones_like(out) * 0.1 + out.detach())
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("window", [(3, 0), (0, 0), (2, 2)])
@pytest.mark.parametrize("ng", [NP, 2])
def test_dot_product_attention_window_matches_hand_written(window, ng):
    q, k, v = _inputs(ng)
    attn = DotProductAttention(_config(num_query_groups=ng, window_size=window), 1,
                               AttnMaskType.causal)  # fmt: skip
    allowed = _allowed(S, S, *window) & _allowed(S, S, -1, 0)  # the causal mask still holds
    out, grads = _fwd_bwd(lambda *t: attn(*t, None), q, k, v)
    ref, ref_grads = _fwd_bwd(lambda *t: _naive(*t, allowed), q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_window_with_kv_cache_aligns_queries_to_the_last_keys():
    q, k, v = _inputs(NP, sq=3, sk=S)
    attn = DotProductAttention(_config(window_size=(4, 0)), 1, AttnMaskType.causal)
    got = attn(q, k, v, None)
    torch.testing.assert_close(got, _naive(q, k, v, _allowed(3, S, 4, 0)), rtol=1e-5, atol=1e-5)


def test_window_counts_positions_inside_each_packed_document():
    q, k, v = (t[:, :1] for t in _inputs(NP))
    cu = torch.tensor([0, 4, S], dtype=torch.int32)
    psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                          max_seqlen_q=6, max_seqlen_kv=6)  # fmt: skip
    attn = DotProductAttention(_config(window_size=(2, 0)), 1, AttnMaskType.causal)
    got = attn(q, k, v, None, packed_seq_params=psp)
    for lo, hi in ((0, 4), (4, S)):
        n = hi - lo
        ref = _naive(q[lo:hi], k[lo:hi], v[lo:hi], _allowed(n, n, 2, 0)).reshape(n, 1, -1)
        torch.testing.assert_close(got[lo:hi], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ng", [NP, 1])
@pytest.mark.parametrize("softmax_type", ["vanilla", "learnable"])
def test_sdpa_window_matches_dot_product_attention(ng, softmax_type):
    cfg = _config(num_query_groups=ng, window_size=(3, 0), softmax_type=softmax_type)
    torch.manual_seed(0)
    ref_attn = DotProductAttention(cfg, 1, AttnMaskType.causal)
    fast = SDPADotProductAttention(cfg, 1, AttnMaskType.causal)
    fast.load_state_dict(ref_attn.state_dict())
    q, k, v = _inputs(ng, seed=3)
    out, grads = _fwd_bwd(lambda *t: fast(*t, None), q, k, v)
    ref, ref_grads = _fwd_bwd(lambda *t: ref_attn(*t, None), q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(window_size=(3,)), "window_size"),
        (dict(window_size=(-2, 0)), "window_size"),
        (dict(window_size=(4, 0), window_attn_skip_freq=0), "window_attn_skip_freq"),
        (dict(window_size=(4, 0), window_attn_skip_freq=[1, 0]), "one int entry per layer"),
        (dict(softmax_type="softmax1"), "softmax_type"),
    ],
)
def test_bad_window_or_softmax_type_is_one_line_error(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_window_size_list_from_yaml_becomes_tuple():
    assert _config(window_size=[127, 0]).window_size == (127, 0)
