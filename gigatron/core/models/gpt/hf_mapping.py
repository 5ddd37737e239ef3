"""Hugging Face GPT-2 / Llama / Qwen3 <-> gigatron (Megatron layout) weights and configs.

The seed of the HF conversion tool. All functions work on full (TP = 1) state dicts, whose layout
is Megatron's checkpoint layout:
- fused QKV rows grouped per query group: [q_1 .. q_{np/ng}, k, v] for group 1, then group 2, ...
  (HF keeps separate q/k/v projections, or GPT-2's [Q; K; V] Conv1D columns);
- GLU fc1 rows [all gate; all up] (HF gate_proj, up_proj);
- GPT-2's Conv1D weights are [in, out], transposed to nn.Linear's [out, in];
- HF Llama's RoPE is rotate-half style, Megatron's default (rotary_interleaved=False), so q/k
  rows need no permutation.
Local-spec norm names are used (`input_layernorm`, `pre_mlp_layernorm`); checkpoint keys rename
them (the layer spec's `sharded_state_dict_keys_map`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core.transformer.transformer_config import TransformerConfig

_L = "decoder.layers.{}."


# ---------------------------------------------------------------- fused QKV layout
def qkv_to_megatron(q: Tensor, k: Tensor, v: Tensor, num_heads: int, num_groups: int) -> Tensor:
    """q [np*hn, ...], k/v [ng*hn, ...] -> fused rows [ng * (np/ng + 2) * hn, ...] per group."""
    hn = q.shape[0] // num_heads
    rest = q.shape[1:]
    q = q.reshape(num_groups, (num_heads // num_groups) * hn, *rest)
    k = k.reshape(num_groups, hn, *rest)
    v = v.reshape(num_groups, hn, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def qkv_from_megatron(qkv: Tensor, num_heads: int, num_groups: int):
    """Inverse of qkv_to_megatron: fused rows -> (q [np*hn, ...], k [ng*hn, ...], v)."""
    q_per_group = num_heads // num_groups
    hn = qkv.shape[0] // (num_groups * (q_per_group + 2))
    rest = qkv.shape[1:]
    grouped = qkv.reshape(num_groups, (q_per_group + 2) * hn, *rest)
    q, k, v = torch.split(grouped, [q_per_group * hn, hn, hn], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


# ---------------------------------------------------------------- GPT-2
def gpt2_config_to_transformer_config(hf_config, **overrides):
    """HF GPT2Config -> (TransformerConfig, GPTModel keyword arguments)."""
    act = hf_config.activation_function
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        activation = functools.partial(F.gelu, approximate="tanh")
    elif act == "gelu":
        activation = F.gelu
    else:
        raise ValueError(f"GPT-2 activation_function {act!r} has no gigatron mapping")
    kwargs = dict(
        num_layers=hf_config.n_layer,
        hidden_size=hf_config.n_embd,
        num_attention_heads=hf_config.n_head,
        ffn_hidden_size=hf_config.n_inner or 4 * hf_config.n_embd,
        layernorm_epsilon=hf_config.layer_norm_epsilon,
        activation_func=activation,
        hidden_dropout=hf_config.resid_pdrop,
        attention_dropout=hf_config.attn_pdrop,
        init_method_std=hf_config.initializer_range,
        add_bias_linear=True,
    )
    kwargs.update(overrides)
    model_kwargs = dict(
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.n_positions,
        position_embedding_type="learned_absolute",
        share_embeddings_and_output_weights=True,
    )
    return TransformerConfig(**kwargs), model_kwargs


def gpt2_to_megatron(hf_sd: dict[str, Tensor], num_layers: int, num_heads: int) -> dict:
    """GPT2LMHeadModel state dict -> full gigatron GPTModel state dict (tied output: no
    output_layer.weight)."""
    p = "transformer."
    out = {
        "embedding.word_embeddings.weight": hf_sd[p + "wte.weight"],
        "embedding.position_embeddings.weight": hf_sd[p + "wpe.weight"],
        "decoder.final_layernorm.weight": hf_sd[p + "ln_f.weight"],
        "decoder.final_layernorm.bias": hf_sd[p + "ln_f.bias"],
    }
    for i in range(num_layers):
        h, g = f"{p}h.{i}.", _L.format(i)
        w = hf_sd[h + "attn.c_attn.weight"].t()  # Conv1D [h, 3h] -> [3h, h] = [Q; K; V]
        b = hf_sd[h + "attn.c_attn.bias"]
        out[g + "self_attention.linear_qkv.weight"] = qkv_to_megatron(
            *w.chunk(3, dim=0), num_heads, num_heads
        )
        out[g + "self_attention.linear_qkv.bias"] = qkv_to_megatron(
            *b.chunk(3, dim=0), num_heads, num_heads
        )
        for ours, theirs in (
            ("self_attention.linear_proj", "attn.c_proj"),
            ("mlp.linear_fc1", "mlp.c_fc"),
            ("mlp.linear_fc2", "mlp.c_proj"),
        ):
            out[g + ours + ".weight"] = hf_sd[h + theirs + ".weight"].t()
            out[g + ours + ".bias"] = hf_sd[h + theirs + ".bias"]
        for ours, theirs in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            out[g + ours + ".weight"] = hf_sd[h + theirs + ".weight"]
            out[g + ours + ".bias"] = hf_sd[h + theirs + ".bias"]
    return {k: v.contiguous() for k, v in out.items()}


# ---------------------------------------------------------------- Llama
def llama_config_to_transformer_config(hf_config, **overrides):
    """HF LlamaConfig -> (TransformerConfig, GPTModel keyword arguments)."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"Llama rope_type {rope.get('rope_type')!r} has no gigatron mapping yet")
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
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=bool(getattr(hf_config, "mlp_bias", False)),
        add_qkv_bias=bool(hf_config.attention_bias),
        hidden_dropout=0.0,
        attention_dropout=hf_config.attention_dropout,
        init_method_std=hf_config.initializer_range,
    )
    if getattr(hf_config, "mlp_bias", False) and not hf_config.attention_bias:
        raise ValueError("Llama with mlp_bias but no attention_bias has no gigatron mapping")
    kwargs.update(overrides)
    model_kwargs = dict(
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
    )
    return TransformerConfig(**kwargs), model_kwargs


_LLAMA_LINEAR = (
    ("self_attention.linear_proj", "self_attn.o_proj"),
    ("mlp.linear_fc2", "mlp.down_proj"),
)
_LLAMA_NORMS = (
    ("input_layernorm", "input_layernorm"),
    ("pre_mlp_layernorm", "post_attention_layernorm"),
    ("self_attention.q_layernorm", "self_attn.q_norm"),  # Qwen3 (qk_layernorm)
    ("self_attention.k_layernorm", "self_attn.k_norm"),
)


def qwen3_config_to_transformer_config(hf_config, **overrides):
    """HF Qwen3Config -> (TransformerConfig, GPTModel kwargs): Llama plus per-head q/k RMSNorm
    (build the model with `get_gpt_layer_local_spec(qk_layernorm=True)`)."""
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("Qwen3 sliding-window attention has no gigatron mapping")
    return llama_config_to_transformer_config(hf_config, qk_layernorm=True, **overrides)


def llama_to_megatron(
    hf_sd: dict[str, Tensor], num_layers: int, num_heads: int, num_query_groups: int
) -> dict:
    """LlamaForCausalLM state dict -> full gigatron GPTModel state dict."""
    out = {
        "embedding.word_embeddings.weight": hf_sd["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf_sd["model.norm.weight"],
    }
    if "lm_head.weight" in hf_sd:
        out["output_layer.weight"] = hf_sd["lm_head.weight"]
    for i in range(num_layers):
        h, g = f"model.layers.{i}.", _L.format(i)
        for suffix in ("weight", "bias"):
            q = hf_sd.get(f"{h}self_attn.q_proj.{suffix}")
            if q is not None:
                out[f"{g}self_attention.linear_qkv.{suffix}"] = qkv_to_megatron(
                    q,
                    hf_sd[f"{h}self_attn.k_proj.{suffix}"],
                    hf_sd[f"{h}self_attn.v_proj.{suffix}"],
                    num_heads,
                    num_query_groups,
                )
            gate = hf_sd.get(f"{h}mlp.gate_proj.{suffix}")
            if gate is not None:  # [all gate; all up]
                out[f"{g}mlp.linear_fc1.{suffix}"] = torch.cat(
                    [gate, hf_sd[f"{h}mlp.up_proj.{suffix}"]], dim=0
                )
            for ours, theirs in _LLAMA_LINEAR:
                if f"{h}{theirs}.{suffix}" in hf_sd:
                    out[f"{g}{ours}.{suffix}"] = hf_sd[f"{h}{theirs}.{suffix}"]
        for ours, theirs in _LLAMA_NORMS:
            if f"{h}{theirs}.weight" in hf_sd:
                out[f"{g}{ours}.weight"] = hf_sd[f"{h}{theirs}.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def megatron_to_llama(
    sd: dict[str, Tensor], num_layers: int, num_heads: int, num_query_groups: int
) -> dict:
    """Full gigatron GPTModel state dict -> LlamaForCausalLM state dict (inverse of the above)."""
    out = {
        "model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
        "model.norm.weight": sd["decoder.final_layernorm.weight"],
    }
    if "output_layer.weight" in sd:
        out["lm_head.weight"] = sd["output_layer.weight"]
    for i in range(num_layers):
        h, g = f"model.layers.{i}.", _L.format(i)
        for suffix in ("weight", "bias"):
            qkv = sd.get(f"{g}self_attention.linear_qkv.{suffix}")
            if qkv is not None:
                q, k, v = qkv_from_megatron(qkv, num_heads, num_query_groups)
                out[f"{h}self_attn.q_proj.{suffix}"] = q
                out[f"{h}self_attn.k_proj.{suffix}"] = k
                out[f"{h}self_attn.v_proj.{suffix}"] = v
            fc1 = sd.get(f"{g}mlp.linear_fc1.{suffix}")
            if fc1 is not None:
                gate, up = fc1.chunk(2, dim=0)
                out[f"{h}mlp.gate_proj.{suffix}"], out[f"{h}mlp.up_proj.{suffix}"] = gate, up
            for ours, theirs in _LLAMA_LINEAR:
                if f"{g}{ours}.{suffix}" in sd:
                    out[f"{h}{theirs}.{suffix}"] = sd[f"{g}{ours}.{suffix}"]
        for ours, theirs in _LLAMA_NORMS:
            if f"{g}{ours}.weight" in sd:
                out[f"{h}{theirs}.weight"] = sd[f"{g}{ours}.weight"]
    return {k: v.contiguous() for k, v in out.items()}
