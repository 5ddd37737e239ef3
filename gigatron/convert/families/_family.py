"""What one Hugging Face family declares: `Family` (config mapping + tensor recipes + support).

No counterpart in megatron.core; Megatron-Bridge keeps the same two halves per model (a
provider mapping the HF config, a mapping registry of per-tensor rules). A family is

    parse(cfg: dict) -> (config_kwargs, model_kwargs, spec_kwargs)
        config.json -> TransformerConfig kwargs (no parallel sizes), GPTModel kwargs (no
        vocab_size), get_gpt_layer_*_spec kwargs. A value gigatron cannot reproduce exactly is
        a ValueError from `config_error` (one line naming the key, its value and the rule).
    recipes(spec, names, padded) -> [Recipe]
        one Recipe per Megatron tensor (per layer, per global expert), both directions;
        `names` holds the HF tensor names (optional tensors: biases, QK norms) and is "every
        name" when planning an export; `padded` is the padded vocabulary size.

The registry (`gigatron.convert.families`) is keyed by config.json's `model_type`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def config_error(family: str, key: str, value, rule: str) -> ValueError:
    return ValueError(f"{family} config.json: {key} ({value!r}) {rule}")


@dataclass(frozen=True)
class Family:
    model_type: str
    """config.json's `model_type` (the registry key)."""
    hf_class: str
    """transformers' causal-LM class of this family (docs, `--list`)."""
    parse: Callable[[dict], tuple[dict, dict, dict]]
    recipes: Callable[..., list]
    features: str
    """One line for `gigatron convert --list`: what the family maps to."""
    tp: bool = True
    pp: bool = True
    ep: bool = False
    """Expert parallel (MoE families)."""
    export: bool = True
    """gigatron -> HF gives bitwise the original tensors."""

    def supports(self) -> str:
        flags = (("TP", self.tp), ("PP", self.pp), ("EP", self.ep), ("export", self.export))
        return " ".join(name for name, ok in flags if ok)
