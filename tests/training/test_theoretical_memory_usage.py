"""gigatron.training.theoretical_memory_usage: weight + optimizer bytes on the busiest rank."""

from types import SimpleNamespace

import pytest

from gigatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory


def _args(**kw):
    base = dict(
        add_bias_linear=False, data_parallel_size=1, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, ffn_hidden_size=64, group_query_attention=False,
        hidden_size=16, kv_channels=4, moe_ffn_hidden_size=None, moe_latent_size=None,
        moe_layer_freq=1, moe_router_topk=1, moe_shared_expert_intermediate_size=None,
        mtp_num_layers=None, multi_latent_attention=False, normalization="LayerNorm",
        num_attention_heads=4, num_experts=None, num_layers=2, padded_vocab_size=32,
        pipeline_model_parallel_size=1, swiglu=False, tensor_model_parallel_size=1,
        untie_embeddings_and_output_weights=False, use_distributed_optimizer=False, world_size=1,
    )  # fmt: skip
    return SimpleNamespace(**(base | kw))


def test_dense_model_by_hand():
    per_layer = 4 * 16 * 16 + 2 * 16 * 64 + 2 * 16 * 2  # attention, MLP, two LayerNorms
    params = 2 * per_layer + 2 * 16 + 16 * 32  # final norm, tied embedding
    assert compute_weight_and_optimizer_memory(_args()) == 18 * params
    untied = compute_weight_and_optimizer_memory(_args(untie_embeddings_and_output_weights=True))
    assert untied == 18 * (params + 16 * 32)


def test_distributed_optimizer_and_tp_shrink_it():
    base = compute_weight_and_optimizer_memory(_args())
    dist_opt = _args(use_distributed_optimizer=True, data_parallel_size=4, world_size=4)
    assert compute_weight_and_optimizer_memory(dist_opt) == pytest.approx(base / 18 * 9)
    assert compute_weight_and_optimizer_memory(_args(tensor_model_parallel_size=2)) < base


def test_routed_experts_split_over_ep_and_etp():
    moe = dict(num_experts=4, moe_ffn_hidden_size=8, world_size=4, data_parallel_size=4)
    one = compute_weight_and_optimizer_memory(_args(**moe))
    ep = compute_weight_and_optimizer_memory(_args(expert_model_parallel_size=2, **moe))
    routed = 2 * 2 * 16 * 8 * 4  # two MoE layers of 4 experts
    assert one - ep == pytest.approx(18 * routed / 2)


def test_bad_moe_layer_freq_length():
    with pytest.raises(ValueError, match="3 entries; expected 2"):
        compute_weight_and_optimizer_memory(_args(num_experts=2, moe_layer_freq=[1, 0, 1]))
