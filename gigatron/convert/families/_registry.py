"""The registry of family adapters: `model_type` -> Family (filled by the family modules)."""

from __future__ import annotations

from gigatron.convert.families._family import Family

FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.model_type in FAMILIES:
        raise ValueError(f"model_type {family.model_type!r} is registered twice")
    FAMILIES[family.model_type] = family
    return family


def get_family(model_type) -> Family:
    if model_type not in FAMILIES:
        raise ValueError(
            f"config.json: model_type ({model_type!r}) is not one of {tuple(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


def describe() -> str:
    """The family table: model_type, transformers class, layouts / export, features."""
    rows = [("model_type", "transformers class", "supports", "features")]
    rows += [(f.model_type, f.hf_class, f.supports(), f.features) for f in FAMILIES.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows
    )
