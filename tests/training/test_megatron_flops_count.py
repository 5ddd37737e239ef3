"""megatron.training.training.num_floating_point_operations (Megatron 0.20's count), checked
against hand-computed numbers for a tiny GPT, a hybrid stack and the packed-sequence split."""

from types import SimpleNamespace

import pytest

from gigatron.training.training import num_floating_point_operations


def _gpt(**kw):
    args = dict(
        num_layers=2, hidden_size=32, num_attention_heads=4, kv_channels=8, seq_length=16,
        padded_vocab_size=64, swiglu=False, ffn_hidden_size=128, group_query_attention=False,
        num_query_groups=4, attention_output_gate=False, multi_latent_attention=False,
        num_experts=None, moe_layer_freq=1, moe_router_topk=0, moe_ffn_hidden_size=None,
        moe_latent_size=None, moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        experimental_attention_variant=None, linear_attention_freq=None,
        hybrid_layer_pattern=None,
    )  # fmt: skip
    return SimpleNamespace(**(args | kw))


def test_dense_gpt_by_hand():
    a, b = _gpt(), 3
    tokens, s2 = b * 16, b * 16 * 16
    attn = 6 * (32 * (32 + 2 * 32) + 32 * 32)  # qkv + out projection per token
    mlp = 6 * 32 * 128 * 2
    logits = 6 * 32 * 64
    expected = tokens * (2 * (attn + mlp) + logits) + s2 * 6 * 32 * 2
    assert num_floating_point_operations(a, b) == expected


def test_packed_sequences_split_linear_and_quadratic_work():
    a = _gpt()
    full = num_floating_point_operations(a, 2)
    packed = num_floating_point_operations(
        a, 2, seqlen_squared_sum_in_batch=2 * 16 * 16 // 4, total_real_tokens_in_batch=2 * 16
    )
    assert full - packed == 6 * 32 * 2 * (2 * 16 * 16 * 3 // 4)  # only core attention shrank
    half = num_floating_point_operations(
        a, 2, seqlen_squared_sum_in_batch=2 * 16 * 16, total_real_tokens_in_batch=16
    )
    assert 2 * half - full == 6 * 32 * 2 * 2 * 16 * 16  # token-linear part halves


def test_gqa_swiglu_moe_and_mtp_terms():
    base = num_floating_point_operations(_gpt(), 1)
    gqa = num_floating_point_operations(_gpt(group_query_attention=True, num_query_groups=1), 1)
    assert base - gqa == 16 * 2 * 6 * 32 * 2 * (32 - 8)  # K and V shrink from 4 groups to 1
    glu = num_floating_point_operations(_gpt(swiglu=True), 1)
    assert glu - base == 16 * 2 * 6 * 32 * 128
    moe = _gpt(num_experts=4, moe_router_topk=2, moe_layer_freq=[0, 1], moe_ffn_hidden_size=64)
    # layer 0 dense (128 wide), layer 1 two routed experts of 64: same MLP work as dense
    assert num_floating_point_operations(moe, 1) == base
    mtp = num_floating_point_operations(_gpt(mtp_num_layers=1), 1)
    attn, mlp = 6 * (32 * 96 + 32 * 32), 6 * 32 * 128 * 2
    extra = 16 * (attn + mlp + 6 * (3 * 32 + 2 * 32 * 32) + 6 * 32 * 64) + 16 * 16 * 6 * 32
    assert mtp - base == extra


def test_bad_moe_layer_freq_is_rejected():
    with pytest.raises(ValueError, match="moe_layer_freq has 3 entries; expected 2"):
        num_floating_point_operations(_gpt(num_experts=2, moe_layer_freq=[1, 0, 1]), 1)


def _hybrid(**kw):
    return _gpt(
        hybrid_layer_pattern="*M-",
        mamba_state_dim=8, mamba_head_dim=8, mamba_num_groups=1, mamba_num_heads=None,
        gdp_num_householder=2, linear_key_head_dim=None, linear_value_head_dim=None,
        linear_num_key_heads=None, linear_num_value_heads=None, linear_conv_kernel_dim=None,
        **kw,
    )  # fmt: skip


def test_hybrid_pattern_counts_each_layer_kind():
    a, t = _hybrid(), 16
    attn = 4 * t * 32 * (32 + 32) + 2 * t * 16 * 32  # p = 1, g = n (no GQA)
    d_in, heads = 64, 64 // 8
    mamba = 2 * t * 32 * (2 * d_in + 2 * 8 + heads) + 7 * t * d_in * 8 + 2 * t * d_in * 32
    mlp = 4 * 4 * t * 32 * 32
    logits = 2 * t * 32 * 64
    assert num_floating_point_operations(a, 1) == 3 * (attn + mamba + mlp + logits)


def test_gdp_spec_replaces_mamba_work():
    plain = num_floating_point_operations(_hybrid(), 1)
    gdp = num_floating_point_operations(_hybrid(spec=["x.hybrid_layer_specs", "gdp_stack_spec"]), 1)
    assert gdp != plain
