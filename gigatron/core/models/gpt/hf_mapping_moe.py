"""Hugging Face Mixtral <-> gigatron (Megatron layout) weights and configs.

Extends `hf_mapping` (whose Llama functions map attention, norms and embeddings) with the MoE
block: HF `mlp.gate.weight [E, h]` is the router weight; HF keeps all experts in two 3-D tensors,
`mlp.experts.gate_up_proj [E, 2f, h]` (rows [gate; up], Megatron's GLU fc1 layout) and
`mlp.experts.down_proj [E, h, f]`. gigatron stores them per expert
(`mlp.experts.local_experts.{e}.linear_fc1.weight`, SequentialMLP) or, with `grouped=True`, as
GroupedMLP's `mlp.experts.weight1 / weight2`. Full (TP = EP = 1) state dicts; `localize_experts`
picks one EP rank's experts. HF's softmax-over-all-experts then renormalised top-k equals
Megatron's default softmax over the top-k logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core import parallel_state as ps
from gigatron.core.models.gpt import hf_mapping
from gigatron.core.transformer.moe.experts import (
    grouped_weights_from_sequential,
    sequential_weights_from_grouped,
)
from gigatron.core.transformer.transformer_config import TransformerConfig

_L = "decoder.layers.{}.mlp."
_H = "model.layers.{}.mlp."


def mixtral_config_to_transformer_config(hf_config, **overrides):
    """HF MixtralConfig -> (TransformerConfig, GPTModel keyword arguments)."""
    if getattr(hf_config, "sliding_window", None) is not None:
        raise ValueError(
            f"Mixtral sliding_window ({hf_config.sliding_window}) has no gigatron mapping "
            "(sliding-window attention is not implemented); set it to None"
        )
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"Mixtral rope_type {rope.get('rope_type')!r} has no gigatron mapping")
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )
    kwargs = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        moe_ffn_hidden_size=hf_config.intermediate_size,
        num_moe_experts=hf_config.num_local_experts,
        moe_router_topk=hf_config.num_experts_per_tok,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=hf_config.router_aux_loss_coef,
        moe_input_jitter_eps=hf_config.router_jitter_noise or None,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=hf_config.attention_dropout,
        init_method_std=hf_config.initializer_range,
    )
    kwargs.update(overrides)
    model_kwargs = dict(
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope.get("rope_theta", getattr(hf_config, "rope_theta", 1e6)),
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
    )
    return TransformerConfig(**kwargs), model_kwargs


def mixtral_to_megatron(
    hf_sd: dict[str, Tensor],
    num_layers: int,
    num_heads: int,
    num_query_groups: int,
    grouped: bool = False,
) -> dict:
    """MixtralForCausalLM state dict -> full gigatron GPTModel state dict."""
    dense = {k: v for k, v in hf_sd.items() if ".mlp." not in k}
    out = hf_mapping.llama_to_megatron(dense, num_layers, num_heads, num_query_groups)
    for i in range(num_layers):
        h, g = _H.format(i), _L.format(i)
        out[g + "router.weight"] = hf_sd[h + "gate.weight"]
        fc1 = list(hf_sd[h + "experts.gate_up_proj"])  # E x [2f, h]
        fc2 = list(hf_sd[h + "experts.down_proj"])  # E x [h, f]
        if grouped:
            out[g + "experts.weight1"], out[g + "experts.weight2"] = (
                grouped_weights_from_sequential(fc1, fc2)
            )
        else:
            for e, (w1, w2) in enumerate(zip(fc1, fc2)):
                out[f"{g}experts.local_experts.{e}.linear_fc1.weight"] = w1
                out[f"{g}experts.local_experts.{e}.linear_fc2.weight"] = w2
    return {k: v.contiguous() for k, v in out.items()}


def megatron_to_mixtral(
    sd: dict[str, Tensor],
    num_layers: int,
    num_heads: int,
    num_query_groups: int,
    num_experts: int,
) -> dict:
    """Full gigatron GPTModel state dict (either expert layout) -> MixtralForCausalLM's."""
    dense = {k: v for k, v in sd.items() if ".mlp." not in k}
    out = hf_mapping.megatron_to_llama(dense, num_layers, num_heads, num_query_groups)
    for i in range(num_layers):
        h, g = _H.format(i), _L.format(i)
        out[h + "gate.weight"] = sd[g + "router.weight"]
        if g + "experts.weight1" in sd:
            fc1, fc2 = sequential_weights_from_grouped(
                sd[g + "experts.weight1"], sd[g + "experts.weight2"], num_experts
            )
        else:
            fc1 = [
                sd[f"{g}experts.local_experts.{e}.linear_fc1.weight"] for e in range(num_experts)
            ]
            fc2 = [
                sd[f"{g}experts.local_experts.{e}.linear_fc2.weight"] for e in range(num_experts)
            ]
        out[h + "experts.gate_up_proj"] = torch.stack(fc1)
        out[h + "experts.down_proj"] = torch.stack(fc2)
    return {k: v.contiguous() for k, v in out.items()}


def localize_experts(sd: dict[str, Tensor], num_experts: int, ep_size: int, ep_rank: int) -> dict:
    """Keep EP rank `ep_rank`'s experts of a full SequentialMLP-layout state dict, renumbered
    from 0 (expert e lives on rank e // (num_experts / ep_size))."""
    if num_experts % ep_size:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by ep_size ({ep_size})")
    n_local = num_experts // ep_size
    out = {}
    for key, value in sd.items():
        if ".local_experts." not in key:
            out[key] = value
            continue
        head, rest = key.split(".local_experts.", 1)
        e, tail = rest.split(".", 1)
        if int(e) // n_local == ep_rank:
            out[f"{head}.local_experts.{int(e) % n_local}.{tail}"] = value
    return out


def _expert_shard(full: Tensor, name: str, config, ep: tuple[int, int], etp: tuple[int, int]):
    """This rank's piece of a full (EP = ETP = 1) GroupedMLP weight1 / weight2."""
    (ep_rank, ep_size), (etp_rank, etp_size) = ep, etp
    num_experts = config.num_moe_experts
    n_local, h = num_experts // ep_size, config.hidden_size
    first = ep_rank * n_local
    if name.endswith("weight1"):  # [h, E*glu*f] viewed [E, h, glu*f]; GLU shard = [gate_r; up_r]
        stride = 2 if config.gated_linear_unit else 1
        local = full.reshape(num_experts, h, -1)[first : first + n_local]
        parts = torch.chunk(local, etp_size * stride, dim=2)
        return torch.cat(parts[etp_rank::etp_size], dim=2).reshape(h, -1)
    local = full.reshape(num_experts, -1, h)[first : first + n_local]  # weight2 [E, f, h]
    return torch.chunk(local, etp_size, dim=1)[etp_rank].reshape(-1, h)


def load_full_moe_state_dict(model, full_sd: dict[str, Tensor]) -> None:
    """`tp_state_dict.load_full_state_dict` for MoE models at any TP x EP x ETP layout.

    `full_sd` is a full (TP = EP = ETP = 1) state dict in the model's expert layout (e.g. from
    `mixtral_to_megatron`): experts are cut to this EP rank's and split over expert TP, the rest
    over TP. With `state_dict()` of an EP = 1 model it reshards to any EP size (strict keys).
    """
    from gigatron.core.models.common.tp_state_dict import shard_for_rank

    config = model.config
    tp = (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
    ep = (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size())
    etp = (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())
    n_local = config.num_moe_experts // ep[1]
    wanted = {}
    for name, param in model.named_parameters():
        key = name
        if ".local_experts." in name:
            head, rest = name.split(".local_experts.", 1)
            i, tail = rest.split(".", 1)
            key = f"{head}.local_experts.{ep[0] * n_local + int(i)}.{tail}"
        wanted[key] = (name, param)
    for e in range(config.num_moe_experts):  # other EP ranks' experts are expected, not loaded
        for key in [k for k in full_sd if f".local_experts.{e}." in k]:
            wanted.setdefault(key, None)
    missing = sorted(set(wanted) - set(full_sd))
    unexpected = sorted(set(full_sd) - set(wanted))
    if missing or unexpected:
        raise ValueError(f"load_full_moe_state_dict: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for key, entry in wanted.items():
            if entry is None:
                continue
            name, param = entry
            full = full_sd[key]
            if name.endswith(("experts.weight1", "experts.weight2")):
                shard = _expert_shard(full, name, config, ep, etp)
            elif ".local_experts." in name:
                shard = shard_for_rank(full, param, *etp)
            else:
                shard = shard_for_rank(full, param, *tp)
            if shard.shape != param.shape:
                raise ValueError(
                    f"load_full_moe_state_dict: {name} shard {tuple(shard.shape)} does not match "
                    f"parameter {tuple(param.shape)} (full {tuple(full.shape)})"
                )
            param.copy_(shard)
