"""A model's recipes (see _recipe_ops.Recipe) from its family adapter, checked for coverage.

Keys use Megatron's TE-style checkpoint names (`linear_qkv.layer_norm_weight`); each family
declares its own (gigatron.convert.families).
"""

from __future__ import annotations

from collections.abc import Callable

from gigatron.convert.families import get_family


class _Every:
    """A set containing every name (plans the recipes of every optional tensor)."""

    def __contains__(self, name) -> bool:
        return True


def family_recipes(family: str) -> Callable:
    """The recipe function of an HF model family: fn(spec, hf_names, padded) -> [Recipe]."""
    return get_family(family).recipes


def recipes_for_keys(spec, keys, padded: int | None = None) -> list:
    """The recipes of the Megatron keys in `keys` (export: keys found in a checkpoint)."""
    keys = set(keys)
    fn = family_recipes(spec.family)
    return [r for r in fn(spec, _Every(), padded or spec.padded_vocab_size) if r.key in keys]


def recipes_for(spec, names, padded: int | None = None) -> list:
    """All recipes of a model; `names` are the HF tensor names (for optional tensors).

    Raises ValueError listing HF tensors no recipe uses, or recipe inputs that are missing.
    """
    names = set(names)
    padded = padded or spec.padded_vocab_size
    recipes = family_recipes(spec.family)(spec, names, padded)
    used = {k for r in recipes for k in r.hf_keys}
    missing = sorted(used - names)
    # Tied models may still store lm_head.weight (a copy): it is not needed.
    unused = sorted(names - used - ({"lm_head.weight"} if spec.tied else set()))
    if missing or unused:
        raise ValueError(
            f"{spec.family}: HF tensors missing {missing[:8]} / not mapped {unused[:8]}"
        )
    return recipes
