"""Per-tensor recipes: one Megatron checkpoint key <-> the HF tensors it is made of.

A Recipe holds the HF names, `to_gig(*hf) -> megatron` and its exact inverse
`to_hf(megatron) -> tuple(hf)`. Both are pure tensor functions, so the same recipe plans shapes on
meta tensors, converts whole checkpoints one key at a time, and fills a TP/PP-sharded model.
Layouts (see gigatron.core.models.gpt.hf_mapping): fused QKV rows per query group, GLU fc1
[all gate; all up], GPT-2 Conv1D weights transposed, embedding/output rows padded with zeros to
the padded vocabulary. Keys use Megatron's TE-style names (`linear_qkv.layer_norm_weight`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gigatron.convert._deepseek_recipes import deepseek_recipes
from gigatron.convert._gemma_recipes import gemma_recipes
from gigatron.convert._recipe_ops import Recipe, _glu, _same, _transposed, _vocab
from gigatron.core.models.gpt.hf_mapping import qkv_from_megatron, qkv_to_megatron


def _qkv(key: str, q: str, k: str, v: str, heads: int, groups: int) -> Recipe:
    return Recipe(
        key,
        (q, k, v),
        lambda tq, tk, tv: qkv_to_megatron(tq, tk, tv, heads, groups),
        lambda t: tuple(x.contiguous() for x in qkv_from_megatron(t, heads, groups)),
    )


def _gpt2_qkv(key: str, hf_key: str, heads: int) -> Recipe:
    """Conv1D c_attn [h, 3h] (or bias [3h]) = [Q | K | V] columns <-> fused rows."""

    def to_gig(t):
        rows = t.t() if t.dim() == 2 else t  # [3h, h] = [Q; K; V]
        return qkv_to_megatron(*rows.chunk(3, dim=0), heads, heads).contiguous()

    def to_hf(t):
        rows = torch.cat(qkv_from_megatron(t, heads, heads), dim=0)
        return ((rows.t() if rows.dim() == 2 else rows).contiguous(),)

    return Recipe(key, (hf_key,), to_gig, to_hf)


def gpt2_recipes(spec, names: set[str], padded: int) -> list[Recipe]:
    """GPT-2 (GPT2LMHeadModel `transformer.` keys or bare GPT2Model keys)."""
    p = "transformer." if "transformer.wte.weight" in names else ""
    c = spec.config_kwargs
    out = [
        _vocab("embedding.word_embeddings.weight", p + "wte.weight", spec.vocab_size, padded),
        _same("embedding.position_embeddings.weight", p + "wpe.weight"),
    ]
    for i in range(c["num_layers"]):
        h, g = f"{p}h.{i}.", f"decoder.layers.{i}."
        for s in ("weight", "bias"):
            out += [
                _same(f"{g}self_attention.linear_qkv.layer_norm_{s}", f"{h}ln_1.{s}"),
                _gpt2_qkv(
                    f"{g}self_attention.linear_qkv.{s}",
                    f"{h}attn.c_attn.{s}",
                    c["num_attention_heads"],
                ),
                _lin(f"{g}self_attention.linear_proj.{s}", f"{h}attn.c_proj.{s}"),
                _same(f"{g}mlp.linear_fc1.layer_norm_{s}", f"{h}ln_2.{s}"),
                _lin(f"{g}mlp.linear_fc1.{s}", f"{h}mlp.c_fc.{s}"),
                _lin(f"{g}mlp.linear_fc2.{s}", f"{h}mlp.c_proj.{s}"),
            ]
    out += [_same(f"decoder.final_layernorm.{s}", f"{p}ln_f.{s}") for s in ("weight", "bias")]
    if not spec.tied:
        out.append(_vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out


def _lin(key: str, hf_key: str) -> Recipe:
    return _transposed(key, hf_key) if key.endswith("weight") else _same(key, hf_key)


def llama_recipes(spec, names: set[str], padded: int) -> list[Recipe]:
    """Llama / Mistral / Qwen2 (and Mixtral's attention, norms and embeddings)."""
    c = spec.config_kwargs
    heads, groups = c["num_attention_heads"], c["num_query_groups"]
    out = [
        _vocab(
            "embedding.word_embeddings.weight", "model.embed_tokens.weight", spec.vocab_size, padded
        )
    ]
    for i in range(c["num_layers"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = f"{h}self_attn."
        out.append(
            _same(f"{g}self_attention.linear_qkv.layer_norm_weight", f"{h}input_layernorm.weight")
        )
        for s in ("weight", "bias"):
            if f"{a}q_proj.{s}" in names:
                out.append(
                    _qkv(
                        f"{g}self_attention.linear_qkv.{s}",
                        f"{a}q_proj.{s}",
                        f"{a}k_proj.{s}",
                        f"{a}v_proj.{s}",
                        heads,
                        groups,
                    )
                )
            if f"{a}o_proj.{s}" in names:
                out.append(_same(f"{g}self_attention.linear_proj.{s}", f"{a}o_proj.{s}"))
        if spec.family == "mixtral":
            out += mixtral_mlp_recipes(spec, i, names)
            continue
        out.append(
            _same(f"{g}mlp.linear_fc1.layer_norm_weight", f"{h}post_attention_layernorm.weight")
        )
        for s in ("weight", "bias"):
            if f"{h}mlp.gate_proj.{s}" in names:
                out.append(
                    _glu(f"{g}mlp.linear_fc1.{s}", f"{h}mlp.gate_proj.{s}", f"{h}mlp.up_proj.{s}")
                )
            if f"{h}mlp.down_proj.{s}" in names:
                out.append(_same(f"{g}mlp.linear_fc2.{s}", f"{h}mlp.down_proj.{s}"))
    out.append(_same("decoder.final_layernorm.weight", "model.norm.weight"))
    if not spec.tied:
        out.append(_vocab("output_layer.weight", "lm_head.weight", spec.vocab_size, padded))
    return out


class _Every:
    """A set containing every name (plans the recipes of every optional tensor)."""

    def __contains__(self, name) -> bool:
        return True


def family_recipes(family: str) -> Callable:
    """The recipe function of an HF model family: fn(spec, hf_names, padded) -> [Recipe]."""
    if family == "gpt2":
        return gpt2_recipes
    if family.startswith("deepseek"):
        return deepseek_recipes
    if family.startswith("gemma"):
        return gemma_recipes
    return llama_recipes


def recipes_for_keys(spec, keys, padded: int | None = None) -> list[Recipe]:
    """The recipes of the Megatron keys in `keys` (export: keys found in a checkpoint)."""
    keys = set(keys)
    fn = family_recipes(spec.family)
    return [r for r in fn(spec, _Every(), padded or spec.padded_vocab_size) if r.key in keys]


def recipes_for(spec, names, padded: int | None = None) -> list[Recipe]:
    """All recipes of a model; `names` are the HF tensor names (for optional biases).

    Raises ValueError listing HF tensors no recipe uses, or recipe inputs that are missing.
    """
    names = set(names)
    padded = padded or spec.padded_vocab_size
    fn = family_recipes(spec.family)
    recipes = fn(spec, names, padded)
    used = {k for r in recipes for k in r.hf_keys}
    missing = sorted(used - names)
    # Tied models may still store lm_head.weight (a copy): it is not needed.
    unused = sorted(names - used - ({"lm_head.weight"} if spec.tied else set()))
    if missing or unused:
        raise ValueError(
            f"{spec.family}: HF tensors missing {missing[:8]} / not mapped {unused[:8]}"
        )
    return recipes


def mixtral_mlp_recipes(spec, layer: int, names) -> list:
    """Mixtral MoE block of layer `layer`: the router and per-expert GLU MLPs.

    Hub / transformers-saved Mixtral files keep `model.layers.{i}.block_sparse_moe.gate.weight`
    [E, h] (the router) and per expert `experts.{e}.w1` (gate), `w3` (up), `w2` (down). gigatron's
    SequentialMLP keys are `decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight`
    ([gate; up] rows, Megatron's GLU layout) and `linear_fc2.weight`; here `e` is the global expert
    index (the layout at expert_model_parallel_size 1). The pre-MLP RMSNorm follows the key
    gigatron's local spec gives it (`mlp.linear_fc1.layer_norm_weight`). Mapping facts from
    gigatron.core.models.gpt.hf_mapping_moe (HF's softmax-then-renormalised top-k equals Megatron's
    softmax over the top-k logits).
    """
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
