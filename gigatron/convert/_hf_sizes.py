"""config.json's sizes against the tensors a HF directory holds, before anything is built.

A config.json comes from elsewhere: `num_hidden_layers: 100000000` or `hidden_size: 1048576`
would have the converter plan a recipe per layer, or training build the model, for minutes or
until memory runs out, before any tensor is found missing. Here each size that decides how much
is allocated (layers, hidden size, vocabulary, positions, FFN width, attention projections,
experts, MLA ranks) is compared with the layer and expert indices in the tensor names and the
shapes in the safetensors headers (read already: headers only). A mismatch is a ValueError on
one line naming config.json, the field, its value and the tensors found.
"""

from __future__ import annotations

import re

_LAYER = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def _field(cfg: dict, key: str, path: str, default=None) -> int:
    value = cfg.get(key, default)
    if type(value) is not int or value <= 0:
        raise ValueError(f"{path}: {key} ({value!r}) must be a positive integer")
    return value


def _indices(pattern, names) -> set[int]:
    return {int(m.group(1)) for n in names for m in [pattern.search(n)] if m}


def _describe(found: set[int], what: str) -> str:
    if not found:
        return f"no {what}"
    return f"{len(found)} {what} (indices {min(found)}..{max(found)})"


def _count(cfg, key, path, found: set[int], what: str, extra: int = 0) -> None:
    """`cfg[key]` must equal the number of `what` the names index (0..n-1; up to `extra` more
    allowed after them, e.g. DeepSeek's multi-token-prediction layers)."""
    n = _field(cfg, key, path)
    complete = sum(1 for i in found if i < n) == n  # every index 0..n-1 is there
    if not complete or (found and max(found) >= n + extra):
        raise ValueError(
            f"{path}: {key} ({n}) does not match the weights: their names hold "
            f"{_describe(found, what)}"
        )


def _shape(shapes: dict, name: str, dims, path: str) -> None:
    """Tensor `name` (when present) must have shape `dims`: [(label, expected size)]."""
    if name not in shapes:
        return
    shape = list(shapes[name])
    if len(shape) == len(dims) and all(s == want for s, (_, want) in zip(shape, dims)):
        return
    bad = [label for s, (label, want) in zip(shape, dims) if s != want] or [dims[0][0]]
    raise ValueError(
        f"{path}: {bad[0]} does not match the weights: {name} has shape {shape}, expected "
        f"{[want for _, want in dims]}"
    )


def check_layer_count(cfg: dict, layers: set[int], path: str) -> None:
    """config.json's layer count (at `path`) against the layer indices a checkpoint holds."""
    key = "n_layer" if cfg.get("model_type") == "gpt2" else "num_hidden_layers"
    if key in cfg:
        _count(cfg, key, path, layers, "layers")


def check_config_sizes(cfg: dict, shapes: dict[str, tuple], path: str) -> None:
    """Refuse a config.json (at `path`) whose sizes disagree with the tensors `shapes`
    ({HF name: shape}, from the safetensors headers). Unknown families are left to
    `spec_from_hf_config`, which names them."""
    family = cfg.get("model_type")
    names = list(shapes)
    layers = _indices(_LAYER, names)

    def f(key, default=None):
        return _field(cfg, key, path, default)

    def lab(key, value):
        return f"{key} ({value})"

    if family == "gpt2":
        _count(cfg, "n_layer", path, layers, "layers")
        h, v = f("n_embd"), f("vocab_size")
        p = "transformer." if "transformer.wte.weight" in shapes else ""
        _shape(shapes, p + "wte.weight", [(lab("vocab_size", v), v), (lab("n_embd", h), h)], path)
        n_pos = f("n_positions", 1024)
        pos = [(lab("n_positions", n_pos), n_pos), (lab("n_embd", h), h)]
        _shape(shapes, p + "wpe.weight", pos, path)
        ffn = f("n_inner") if cfg.get("n_inner") is not None else 4 * h
        fc = [(lab("n_embd", h), h), (lab("n_inner", ffn), ffn)]  # Conv1D: [in, out]
        _shape(shapes, f"{p}h.0.mlp.c_fc.weight", fc, path)
        return
    from gigatron.convert.families import FAMILIES

    if family not in FAMILIES:
        return
    extra = cfg.get("num_nextn_predict_layers") or 0
    _count(cfg, "num_hidden_layers", path, layers, "layers", extra if type(extra) is int else 0)
    h, v = f("hidden_size"), f("vocab_size")
    hid = (lab("hidden_size", h), h)
    _shape(shapes, "model.embed_tokens.weight", [(lab("vocab_size", v), v), hid], path)
    _shape(shapes, "lm_head.weight", [(lab("vocab_size", v), v), hid], path)
    ffn = f("intermediate_size")
    deepseek = family.startswith("deepseek")
    # layer 0: dense in Llama-like models and in DeepSeek's first_k_dense_replace layers
    _shape(shapes, "model.layers.0.mlp.down_proj.weight",
           [hid, (lab("intermediate_size", ffn), ffn)], path)  # fmt: skip
    for key in ("num_local_experts", "num_experts"):  # Mixtral / Qwen-MoE, OLMoE
        if key in cfg and _indices(_EXPERT, names):
            _count(cfg, key, path, _indices(_EXPERT, names), "experts")
    if family == "gpt_oss":  # experts stacked: [E, h, 2f] and [E, f, h]
        n, x = f("num_local_experts"), "model.layers.0.mlp.experts."
        num, inter = (lab("num_local_experts", n), n), (lab("intermediate_size", ffn), ffn)
        two_f = (f"2 x intermediate_size ({ffn})", 2 * ffn)
        _shape(shapes, x + "gate_up_proj", [num, hid, two_f], path)
        _shape(shapes, x + "down_proj", [num, inter, hid], path)
    if family == "mixtral":
        moe = "model.layers.0.block_sparse_moe.experts.0.w2.weight"
        _shape(shapes, moe, [hid, (lab("intermediate_size", ffn), ffn)], path)
    if not deepseek:
        heads = f("num_attention_heads")
        head_dim = cfg.get("head_dim") or h // heads
        kv = f("num_key_value_heads", heads)
        q = (f"num_attention_heads ({heads}) x head_dim ({head_dim})", heads * head_dim)
        k = (f"num_key_value_heads ({kv}) x head_dim ({head_dim})", kv * head_dim)
        a = "model.layers.0.self_attn."
        _shape(shapes, a + "q_proj.weight", [q, hid], path)
        _shape(shapes, a + "k_proj.weight", [k, hid], path)
        _shape(shapes, a + "o_proj.weight", [hid, q], path)
        return
    _count(cfg, "n_routed_experts", path, _indices(_EXPERT, names), "routed experts")
    moe_ffn = f("moe_intermediate_size")
    last = f("num_hidden_layers") - 1  # an MoE layer unless every layer is dense
    _shape(shapes, f"model.layers.{last}.mlp.experts.0.down_proj.weight",
           [hid, (lab("moe_intermediate_size", moe_ffn), moe_ffn)], path)  # fmt: skip
    a = "model.layers.0.self_attn."
    kv_rank, rope = f("kv_lora_rank"), f("qk_rope_head_dim")
    kv_down = (f"kv_lora_rank ({kv_rank}) + qk_rope_head_dim ({rope})", kv_rank + rope)
    _shape(shapes, a + "kv_a_proj_with_mqa.weight", [kv_down, hid], path)
    if cfg.get("q_lora_rank") is not None:
        q_rank = f("q_lora_rank")
        _shape(shapes, a + "q_a_proj.weight", [(lab("q_lora_rank", q_rank), q_rank), hid], path)
