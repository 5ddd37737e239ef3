"""FLOP counts against hand-computed values."""

from types import SimpleNamespace

import pytest

from gigatron.training.flops import flops_per_token, num_floating_point_operations


def test_dense_gpt_equals_paper_formula():
    # gpt-125m of the anchor benchmarks: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    B, s, L, h, V = 16, 1024, 12, 768, 50304
    expected = 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    args = SimpleNamespace(
        num_layers=L,
        hidden_size=h,
        seq_length=s,
        padded_vocab_size=V,
        num_attention_heads=12,
        kv_channels=64,
        num_query_groups=12,
        ffn_hidden_size=4 * h,
        swiglu=False,
        num_experts=None,
        moe_router_topk=2,
    )
    assert num_floating_point_operations(args, B) == pytest.approx(expected, rel=1e-12)


def test_gqa_swiglu_by_hand():
    # h=8, 4 heads of d=2 (q=8), 2 KV groups, s=4, ffn=12 SwiGLU, V=10, 1 layer.
    # attention: 8*(8 + 2*2*2) + 8*8 + 2*4*8 = 128 + 64 + 64 = 256
    # mlp: 3*8*12 = 288; logits 8*10 = 80  -> 6*(256 + 288 + 80) = 3744 per token
    got = flops_per_token(
        num_layers=1,
        hidden_size=8,
        seq_length=4,
        vocab_size=10,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=12,
        gated_linear_unit=True,
    )
    assert got == 3744.0


def test_moe_counts_topk_experts_shared_and_router():
    # h=8, 2 heads MHA (q=8, g=2, d=4), s=2: attention 8*(8+16) + 64 + 2*2*8 = 192+64+32 = 288
    # 8 experts top-2, f=6, GELU (m=2): 2*8*6*2 = 192; router 8*8 = 64; shared 2*8*4 = 64
    # logits 8*16 = 128; 2 layers -> 6*(2*(288+192+64+64) + 128) = 6*1344 = 8064
    got = flops_per_token(
        num_layers=2,
        hidden_size=8,
        seq_length=2,
        vocab_size=16,
        num_attention_heads=2,
        num_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=6,
        moe_shared_expert_intermediate_size=4,
    )
    assert got == 8064.0
