"""gigatron.core.transformer: transformer building blocks (mirrors megatron.core.transformer).

Names load lazily so importing the config does not import every module.
"""

import importlib

_LAZY = {
    "MegatronModule": "gigatron.core.transformer.module",
    "ModuleSpec": "gigatron.core.transformer.spec_utils",
    "build_module": "gigatron.core.transformer.spec_utils",
    "TransformerConfig": "gigatron.core.transformer.transformer_config",
    "MLATransformerConfig": "gigatron.core.transformer.transformer_config",
    "TransformerLayer": "gigatron.core.transformer.transformer_layer",
    "TransformerLayerSubmodules": "gigatron.core.transformer.transformer_layer",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'gigatron.core.transformer' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
