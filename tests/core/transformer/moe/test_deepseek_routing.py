"""DeepSeek routing in Megatron's terms equals transformers' DeepSeek routers (process-free).

V3: sigmoid scores, e_score_correction_bias for the choice only (moe_router_enable_expert_bias),
group-limited top-k (n_group / topk_group -> moe_router_num_groups / moe_router_group_topk),
renormalised, times routed_scaling_factor (moe_router_topk_scaling_factor). V2: softmax over all
experts then top-k without renormalising (moe_router_pre_softmax), times the scaling factor.
"""

import pytest
import torch

from gigatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

transformers = pytest.importorskip("transformers")
T, H, E = 64, 16, 8


def _dense(weights, indices):
    return torch.zeros(weights.shape[0], E).scatter(1, indices, weights)


def test_v3_sigmoid_grouped_biased_routing_matches_transformers():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = transformers.DeepseekV3Config(
        hidden_size=H, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=4,
        n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.normal_(0, 1, generator=gen)
        router.e_score_correction_bias.normal_(0, 0.3, generator=gen)
    x = torch.randn(T, H, generator=gen)
    logits, weights, indices = router(x)
    probs, routing_map = topk_routing_with_score_function(
        logits, 4, num_groups=4, group_topk=2, scaling_factor=2.5, score_function="sigmoid",
        expert_bias=router.e_score_correction_bias,
    )  # fmt: skip
    want = _dense(weights, indices)
    assert torch.equal(routing_map, want > 0)
    torch.testing.assert_close(probs, want, rtol=1e-6, atol=1e-7)
    # the bias changes the choice (else this test would not see it)
    unbiased, _ = topk_routing_with_score_function(
        logits, 4, num_groups=4, group_topk=2, scaling_factor=2.5, score_function="sigmoid"
    )
    assert not torch.equal(unbiased > 0, routing_map)


def test_v2_softmax_routing_matches_transformers():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = transformers.DeepseekV2Config(
        hidden_size=H, num_attention_heads=4, n_routed_experts=E, num_experts_per_tok=3,
        routed_scaling_factor=1.5,
        topk_method="greedy",
    )  # fmt: skip
    router = DeepseekV2TopkRouter(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.normal_(0, 1, generator=gen)
    logits, weights, indices = router(torch.randn(T, H, generator=gen))
    probs, _ = topk_routing_with_score_function(
        logits, 3, use_pre_softmax=True, scaling_factor=1.5, score_function="softmax"
    )
    torch.testing.assert_close(probs, _dense(weights, indices), rtol=1e-6, atol=1e-7)
