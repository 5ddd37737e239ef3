"""The Hugging Face families `gigatron convert` knows, keyed by config.json's `model_type`.

One module per family (or per group of families sharing layers) declares a `Family`
(`_family.py`): the config mapping and one recipe per tensor, both directions. `get_family`
looks one up; an unknown `model_type` is a one-line ValueError naming the known ones.
`gigatron convert --list` prints `describe()` (in registration order). Adding a family:
docs/convert.md. Family modules import `_family` / `_registry`, never this package (no cycle).
"""

from __future__ import annotations

from gigatron.convert.families import (  # noqa: F401
    deepseek,
    gemma,
    gpt2,
    gpt_oss,
    llama,
    mixtral,
    phi3,
    qwen2_moe,
    qwen3,
)
from gigatron.convert.families._family import Family, config_error
from gigatron.convert.families._registry import FAMILIES, describe, get_family, register

__all__ = ["FAMILIES", "Family", "config_error", "describe", "get_family", "register"]
