"""Mixtral MoE block recipes (see `_recipes.py`): router and per-expert GLU MLPs.

Hub / transformers-saved Mixtral files keep `model.layers.{i}.block_sparse_moe.gate.weight`
[E, h] (the router) and per expert `experts.{e}.w1` (gate), `w3` (up), `w2` (down). gigatron's
SequentialMLP keys are `decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight`
([gate; up] rows, Megatron's GLU layout) and `linear_fc2.weight`; here `e` is the global expert
index (the layout at expert_model_parallel_size 1). The pre-MLP RMSNorm follows the key gigatron's
local spec gives it (`mlp.linear_fc1.layer_norm_weight`). Mapping facts from
gigatron.core.models.gpt.hf_mapping_moe (HF's softmax-then-renormalised top-k equals Megatron's
softmax over the top-k logits).
"""

from __future__ import annotations

from gigatron.convert._recipes import _glu, _same


def mixtral_mlp_recipes(spec, layer: int, names) -> list:
    h, g = f"model.layers.{layer}.", f"decoder.layers.{layer}."
    moe = f"{h}block_sparse_moe."
    out = [
        _same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight"),
        _same(f"{g}mlp.router.weight", f"{moe}gate.weight"),
    ]
    for e in range(spec.config_kwargs["num_moe_experts"]):
        x, y = f"{moe}experts.{e}.", f"{g}mlp.experts.local_experts.{e}."
        out += [
            _glu(f"{y}linear_fc1.weight", f"{x}w1.weight", f"{x}w3.weight"),
            _same(f"{y}linear_fc2.weight", f"{x}w2.weight"),
        ]
    return out
