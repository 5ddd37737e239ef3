"""The MoE block recipes MoE families share: router, per-expert SwiGLU MLPs, shared expert.

gigatron's checkpoint names one tensor per global expert
(`decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc{1,2}.weight`, e global: the layout
at expert_model_parallel_size 1; dist_checkpointing stacks and reshards them for any EP), fc1
rows [gate; up]. The pre-MLP RMSNorm keeps the local spec's key `mlp.linear_fc1.layer_norm_weight`.
"""

from __future__ import annotations

from gigatron.convert._recipe_ops import Recipe, glu, same
from gigatron.convert.families._family import config_error


def moe_mlp(
    spec,
    i: int,
    names,
    *,
    block: str = "mlp",
    gate: str = "gate_proj",
    up: str = "up_proj",
    down: str = "down_proj",
    shared: str | None = None,
    shared_gate: str | None = None,
) -> list[Recipe]:
    """Layer i's MoE block from HF `model.layers.{i}.{block}.`: `gate` (router [E, h]),
    `experts.{e}.{gate|up|down}`, and optionally a shared expert `{shared}.{gate|up|down}`
    with its sigmoid gate `{shared_gate}.weight` [1, h] (Megatron's moe_shared_expert_gate)."""
    c = spec.config_kwargs
    h, g = f"model.layers.{i}.", f"decoder.layers.{i}.mlp."
    m = f"{h}{block}."
    out = [
        same(f"{g}linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight"),
        same(f"{g}router.weight", f"{m}gate.weight"),
    ]
    for e in range(c["num_moe_experts"]):
        x, y = f"{m}experts.{e}.", f"{g}experts.local_experts.{e}."
        out += [
            glu(f"{y}linear_fc1.weight", f"{x}{gate}.weight", f"{x}{up}.weight"),
            same(f"{y}linear_fc2.weight", f"{x}{down}.weight"),
        ]
    if shared:
        x, y = f"{m}{shared}.", f"{g}shared_experts."
        out += [
            glu(f"{y}linear_fc1.weight", f"{x}{gate}.weight", f"{x}{up}.weight"),
            same(f"{y}linear_fc2.weight", f"{x}{down}.weight"),
        ]
    if shared_gate:
        out.append(same(f"{g}shared_experts.gate_weight", f"{m}{shared_gate}.weight"))
    return out


def softmax_topk_moe(family: str, cfg: dict, *, experts: int) -> dict:
    """TransformerConfig MoE kwargs of a Qwen-style block: softmax over all experts, top-k,
    renormalised only with `norm_topk_prob` (Megatron: moe_router_pre_softmax=True keeps the
    softmax-over-all scores; False takes the softmax over the top-k logits = renormalised);
    every layer an MoE layer (`decoder_sparse_step` 1, no `mlp_only_layers`)."""
    if cfg.get("decoder_sparse_step", 1) != 1:
        step = cfg["decoder_sparse_step"]
        raise config_error(family, "decoder_sparse_step", step, "must be 1 (every layer MoE)")
    if cfg.get("mlp_only_layers"):
        raise config_error(family, "mlp_only_layers", cfg["mlp_only_layers"], "must be empty")
    if cfg.get("router_jitter_noise", 0.0):
        raise config_error(family, "router_jitter_noise", cfg["router_jitter_noise"], "must be 0")
    return dict(
        num_moe_experts=experts,
        moe_router_topk=cfg["num_experts_per_tok"],
        moe_ffn_hidden_size=cfg["moe_intermediate_size"],
        moe_aux_loss_coeff=cfg.get("router_aux_loss_coef", 0.0),
        moe_router_pre_softmax=not cfg.get("norm_topk_prob", False),
        moe_token_dispatcher_type="alltoall",
    )
