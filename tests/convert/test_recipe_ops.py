"""The per-tensor transforms families declare invert exactly (both directions, one declaration)."""

import torch

from gigatron.convert._recipe_ops import fused_qkv, glu, qkv_from_megatron, qkv_to_megatron


def test_qkv_layout_is_grouped_per_query_group():
    """Rows [q1 q2 k1 v1 | q3 q4 k2 v2] for 4 heads in 2 groups, head dim 1."""
    q = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    k = torch.tensor([[10.0], [20.0]])
    v = torch.tensor([[100.0], [200.0]])
    fused = qkv_to_megatron(q, k, v, num_heads=4, num_groups=2)
    assert fused.flatten().tolist() == [1, 2, 10, 100, 3, 4, 20, 200]
    for a, b in zip(qkv_from_megatron(fused, num_heads=4, num_groups=2), (q, k, v)):
        assert torch.equal(a, b)


def test_fused_qkv_rows_regroup_per_query_group_and_back():
    """Phi-3's qkv_proj rows [Q; K; V] -> the same per-group rows as separate q / k / v."""
    rows = torch.tensor([[1.0], [2.0], [3.0], [4.0], [10.0], [20.0], [100.0], [200.0]])
    recipe = fused_qkv("k", "hf", heads=4, groups=2)
    fused = recipe.to_gig(rows)
    assert fused.flatten().tolist() == [1, 2, 10, 100, 3, 4, 20, 200]
    assert torch.equal(recipe.to_hf(fused)[0], rows)


def test_glu_rows_are_all_gate_then_all_up():
    gate, up = torch.zeros(3, 2), torch.ones(3, 2)
    recipe = glu("k", "g", "u")
    fc1 = recipe.to_gig(gate, up)
    assert fc1[:3].eq(0).all() and fc1[3:].eq(1).all()
    assert all(torch.equal(a, b) for a, b in zip(recipe.to_hf(fc1), (gate, up)))
