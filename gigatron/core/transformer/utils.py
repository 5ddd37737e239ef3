"""Initialisers and small helpers shared by the transformer modules.

Mirrors the parts of `megatron.core.utils` / `megatron.core.transformer.utils` the model code uses:
`init_method_normal`, `scaled_init_method_normal`, `attention_mask_func`, `get_default_causal_mask`,
`get_sliding_window_causal_mask` / `is_layer_window_attention` (sliding windows;
`sliding_window_mask` on any positions is the one window rule, which every attention path, the
fused-softmax shim and context parallelism use through Megatron's function), `logit_softcapping`
(Megatron-Bridge's Gemma 2 helper), and the sharded-state-dict helpers
(`make_sharded_tensors_for_checkpoint`, `make_sharded_object_for_checkpoint`, defined in
`gigatron.core.utils` so the tensor-parallel layers can use them too;
`sharded_state_dict_default`).
"""

from __future__ import annotations

import functools
import math

import torch

from gigatron.core import parallel_state
from gigatron.core.utils import (
    make_sharded_object_for_checkpoint,
    make_sharded_tensors_for_checkpoint,
)

__all__ = [
    "attention_mask_func",
    "check_attention_mask",
    "ensure_metadata_has_dp_cp_group",
    "get_default_causal_mask",
    "get_sliding_window_causal_mask",
    "init_method_normal",
    "is_layer_window_attention",
    "logit_softcapping",
    "make_sharded_object_for_checkpoint",
    "make_sharded_tensors_for_checkpoint",
    "scaled_init_method_normal",
    "set_model_config_attribute",
    "set_model_to_sequence_parallel",
    "sharded_state_dict_default",
    "sliding_window_mask",
]


def _normal_(tensor: torch.Tensor, *, std: float) -> torch.Tensor:
    return torch.nn.init.normal_(tensor, mean=0.0, std=std)


def init_method_normal(sigma: float):
    """Init method drawing from N(0, sigma)."""
    return functools.partial(_normal_, std=sigma)


def scaled_init_method_normal(sigma: float, num_layers: int, multiplier: float = 2.0):
    """Init method drawing from N(0, sigma / sqrt(multiplier * num_layers)) (output layers)."""
    return functools.partial(_normal_, std=sigma / math.sqrt(multiplier * num_layers))


def attention_mask_func(attention_scores: torch.Tensor, attention_mask: torch.Tensor):
    """Megatron's mask function: positions where the bool mask is True get -10000."""
    return attention_scores.masked_fill(attention_mask, -10000.0)


def check_attention_mask(attention_mask, name: str = "attention_mask") -> None:
    """Refuse a mask that is not Megatron's: a bool tensor [b|1, 1, sq, sk], True where a score
    is masked out (or None: the layer's mask type, causal for GPT). A float or integer mask
    (`torch.ones(b, 1, s, s)`, 1 = attend) would otherwise fail deep inside attention."""
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return
    if attention_mask.dtype != torch.bool:
        raise TypeError(
            f"{name} has dtype {attention_mask.dtype}; Megatron Core takes a bool mask "
            "[b|1, 1, sq, sk] with True where attention is masked out, or None for causal "
            f"attention (a mask of 1 = attend converts with `{name} < 0.5`)"
        )


@functools.lru_cache(maxsize=32)
def _causal_mask_cpu(sq: int, sk: int) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool).triu(diagonal=1 + sk - sq)


def get_default_causal_mask(sq: int, sk: int | None = None, device=None) -> torch.Tensor:
    """Bool causal mask [sq, sk], True above the diagonal (masked out)."""
    mask = _causal_mask_cpu(sq, sq if sk is None else sk)
    return mask if device is None else mask.to(device)


def ensure_metadata_has_dp_cp_group(metadata: dict | None) -> dict:
    """`metadata` with its `dp_cp_group` entry (the data-parallel x context-parallel group the
    replica ids are taken over): a new dict when `metadata` is None, the same dict updated in
    place when the entry is missing (Megatron's callers read it back after saving). Before
    `initialize_model_parallel` the entry is None: the one-process world."""
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        raise TypeError(f"metadata ({type(metadata).__name__}) must be a dict (or None)")
    if "dp_cp_group" not in metadata:
        metadata["dp_cp_group"] = (
            parallel_state.get_data_parallel_group(with_context_parallel=True)
            if parallel_state.model_parallel_is_initialized()
            else None
        )
    return metadata


def sliding_window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window_size) -> torch.Tensor:
    """Bool [sq, sk], True where key position k_pos[j] lies outside query q_pos[i]'s window.

    window_size = (left, right), Megatron's / Transformer Engine's convention: a query at
    position p sees keys p - left .. p + right; -1 on a side means unbounded there. (W, 0) is
    causal with W keys back, W + 1 keys in all (Hugging Face's `sliding_window` W' is
    (W' - 1, 0)). q_pos [sq], k_pos [sk]: integer positions (global ones under context
    parallelism, positions inside the document for packed sequences). OR it with a causal or
    padding mask.
    """
    left, right = window_size
    ahead = k_pos.reshape(1, -1) - q_pos.reshape(-1, 1)  # [sq, sk]: how far after the query
    masked = torch.zeros(ahead.shape, dtype=torch.bool, device=ahead.device)
    if left >= 0:
        masked |= ahead < -left
    if right >= 0:
        masked |= ahead > right
    return masked


def get_sliding_window_causal_mask(sq: int, skv: int, window_size, device=None) -> torch.Tensor:
    """Megatron's sliding-window mask: bool [sq, skv], True = masked, `sliding_window_mask` with
    the queries aligned bottom-right (query i at position skv - sq + i: a KV cache, or the whole
    sequence when sq = skv), so (left, 0) is causal. Unlike Megatron's, -1 means unbounded."""
    q_pos = torch.arange(skv - sq, skv, device=device)
    return sliding_window_mask(q_pos, torch.arange(skv, device=device), window_size)


def logit_softcapping(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap) (Gemma 2's attention-score and final-logit cap); unchanged for
    cap None."""
    if not cap:
        return logits
    return torch.tanh(logits / cap) * cap


def sharded_state_dict_default(
    module: torch.nn.Module, prefix: str = "", sharded_offsets=(), metadata=None, tp_group=None
) -> dict:
    """`module.sharded_state_dict(...)` when it has one; else its own `state_dict` as
    TP-replicated ShardedTensors (replica ids over `tp_group`), keyed `prefix + name`."""
    if hasattr(module, "sharded_state_dict"):
        return module.sharded_state_dict(
            prefix=prefix, sharded_offsets=sharded_offsets, metadata=metadata
        )
    dp_cp_group = (metadata or {}).get("dp_cp_group")
    return make_sharded_tensors_for_checkpoint(
        module.state_dict(prefix="", keep_vars=True),
        prefix,
        {},
        sharded_offsets,
        tp_group=tp_group,
        dp_cp_group=dp_cp_group,
    )


def is_layer_window_attention(window_size, window_attn_skip_freq, layer_number: int) -> bool:
    """Whether 1-based layer `layer_number` uses sliding-window attention.

    No `window_size`: never. `window_attn_skip_freq` None: every layer; an int k: every layer
    except each k-th (layer_number % k == 0 is full attention); a list: its truthiness at
    index layer_number - 1 (one entry per layer).
    """
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    if isinstance(window_attn_skip_freq, int):
        return layer_number % window_attn_skip_freq != 0
    if isinstance(window_attn_skip_freq, list):
        return bool(window_attn_skip_freq[layer_number - 1])
    raise ValueError(
        f"window_attn_skip_freq ({window_attn_skip_freq!r}, {type(window_attn_skip_freq)}) "
        "must be None, an int or a list with one entry per layer"
    )


def set_model_config_attribute(model, attribute: str, value) -> None:
    """`config.<attribute> = value` on `model.config` and on every distinct child config that
    has the attribute (layers may hold their own config objects); wrappers with `.module`
    (DDP, Float16Module) are looked through to find the modules."""
    root = model.config
    setattr(root, attribute, value)
    done = {id(root)}
    module, seen = model, set()
    while not isinstance(module, torch.nn.Module):
        seen.add(id(module))
        module = getattr(module, "module", None)
        if module is None or id(module) in seen:
            return
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and id(config) not in done and hasattr(config, attribute):
            setattr(config, attribute, value)
            done.add(id(config))


# id(model) -> {attribute name -> modules having it}; filled once per model.
_sequence_parallel_attr_cache: dict[int, dict[str, list[torch.nn.Module]]] | None = None


def _init_sequence_parallel_cache(model, exclude_modules) -> None:
    """Record which modules of `model` carry each sequence-parallel attribute (once per model)."""
    global _sequence_parallel_attr_cache
    if _sequence_parallel_attr_cache is None:
        _sequence_parallel_attr_cache = {}
    if id(model) in _sequence_parallel_attr_cache:
        return
    attrs = ["sequence_parallel", "scatter_to_sequence_parallel", "reduce_scatter_embeddings"]
    if getattr(model, "position_embedding_type", None) == "learned_absolute":
        attrs.remove("reduce_scatter_embeddings")  # learned positions are added before the scatter
    found: dict[str, list[torch.nn.Module]] = {a: [] for a in attrs}

    def visit(module):
        if exclude_modules is not None and module in exclude_modules:
            return
        for attr in attrs:
            if hasattr(module, attr):
                found[attr].append(module)
        for child in module._modules.values():
            if child is not None:
                visit(child)

    visit(model)
    _sequence_parallel_attr_cache[id(model)] = found


def set_model_to_sequence_parallel(model, set_to: bool = False, exclude_modules=None) -> None:
    """Turn sequence parallelism on or off on a built model: `model.config.sequence_parallel`
    and every module's `sequence_parallel` / `scatter_to_sequence_parallel` /
    `reduce_scatter_embeddings` attribute (modules in `exclude_modules` and below keep theirs)."""
    _init_sequence_parallel_cache(model, exclude_modules)
    model.config.sequence_parallel = set_to
    for attr, modules in _sequence_parallel_attr_cache[id(model)].items():
        for module in modules:
            setattr(module, attr, set_to)
