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


def test_stacked_interleaved_experts_split_and_stack_back():
    """GPT-OSS's gate_up_proj [E, h, 2f] (columns g0 u0 g1 u1 ..): expert e's fc1 is [gate; up]
    rows of the transpose; `hf_outputs` stacks the E inverse slices back into one tensor, and a
    missing expert is a one-line error naming the tensor."""
    import pytest

    from gigatron.convert._recipe_ops import hf_outputs, interleave_glu, interleaved_glu, stacked

    num, h, f = 3, 2, 2
    hf = torch.arange(num * h * 2 * f, dtype=torch.float32).reshape(num, h, 2 * f)
    recipes = [
        stacked(f"e{e}", "gate_up", e, num, lambda t: interleaved_glu(t.t()),
                lambda t: interleave_glu(t).t())
        for e in range(num)
    ]  # fmt: skip
    fc1 = {r.key: r.to_gig(hf) for r in recipes}
    assert fc1["e1"][:f].tolist() == hf[1, :, 0::2].t().tolist()  # gate rows first
    assert fc1["e1"][f:].tolist() == hf[1, :, 1::2].t().tolist()
    ((name, back),) = list(hf_outputs(recipes, fc1.__getitem__))
    assert name == "gate_up" and torch.equal(back, hf)
    with pytest.raises(ValueError, match=r"gate_up: stacked HF tensor lacks experts \[2\]"):
        list(hf_outputs(recipes[:2], fc1.__getitem__))
