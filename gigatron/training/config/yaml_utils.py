"""Writing configs holding functions, partials, enums and dtypes as YAML (Megatron 0.20's
`config.yaml_utils`): each becomes a `_target_` mapping that `instantiate` reads back.

    function / class   -> {_target_: module.qualname, _call_: false}
    functools.partial  -> {_target_: module.qualname, _partial_: true, _args_: [...], **keywords}
    Enum member        -> {_target_: module.EnumClass, _call_: true, _args_: [value], _name_: NAME}
    torch dtype        -> {_target_: torch.float32, _call_: false}
    HF config          -> {_target_: module.Class.from_dict, _call_: true, config_dict: {...}}
    any other object   -> {_target_: module.Class, _call_: true}  (its class, called bare)

Writing only: reading goes through `gigatron.core.untrusted_yaml` (plain values) and
`instantiate` (an allowlist of targets).
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager

try:
    import yaml

    HAVE_YAML = True
except ImportError:  # pragma: no cover - pyyaml is a gigatron dependency
    HAVE_YAML = False


def _name(obj) -> str:
    return f"{inspect.getmodule(obj).__name__}.{obj.__qualname__}"


@contextmanager
def safe_yaml_representers() -> Iterator[None]:
    """`yaml.SafeDumper` writes the objects above while inside; its representers are restored
    on leaving (also on an exception)."""
    if not HAVE_YAML:
        raise ImportError("writing YAML needs PyYAML: pip install pyyaml")
    saved = yaml.SafeDumper.yaml_representers.copy()
    saved_multi = yaml.SafeDumper.yaml_multi_representers.copy()
    try:
        yaml.SafeDumper.add_representer(functools.partial, _partial_representer)
        yaml.SafeDumper.add_multi_representer(enum.Enum, _enum_representer)
        yaml.SafeDumper.add_representer(type(lambda: ...), _function_representer)
        yaml.SafeDumper.add_representer(type(object), _function_representer)
        try:
            import torch

            yaml.SafeDumper.add_representer(torch.dtype, _torch_dtype_representer)
        except ModuleNotFoundError:  # pragma: no cover
            pass
        try:
            from transformers import GenerationConfig, PretrainedConfig
        except ImportError:
            pass
        else:
            yaml.SafeDumper.add_representer(GenerationConfig, _generation_config_representer)
            yaml.SafeDumper.add_multi_representer(PretrainedConfig, _pretrained_config_representer)
        yaml.SafeDumper.add_multi_representer(object, _safe_object_representer)
        yield
    finally:
        yaml.SafeDumper.yaml_representers = saved
        yaml.SafeDumper.yaml_multi_representers = saved_multi


def _function_representer(dumper, data):
    return dumper.represent_data({"_target_": _name(data), "_call_": False})


def _torch_dtype_representer(dumper, data):
    return dumper.represent_data({"_target_": str(data), "_call_": False})


def _safe_object_representer(dumper, data):
    """An object with a `__qualname__` (a class, a function) by name; any other as its class,
    called with no arguments."""
    try:
        value = {"_target_": _name(data), "_call_": False}
    except AttributeError:
        value = {"_target_": _name(data.__class__), "_call_": True}
    return dumper.represent_data(value)


def _partial_representer(dumper, data):
    value = {
        "_target_": _name(data.func),
        "_partial_": True,
        "_args_": list(data.args) if data.args else [],
    }
    value.update(data.keywords or {})
    return dumper.represent_data(value)


def _enum_representer(dumper, data):
    value = {
        "_target_": _name(data.__class__),
        "_call_": True,
        "_args_": [data.value],
        "_name_": data.name,
    }
    return dumper.represent_data(value)


def _generation_config_representer(dumper, data):
    return _pretrained_config_representer(dumper, data)


def _pretrained_config_representer(dumper, data):
    """A Hugging Face config through its `from_dict` / `to_dict`."""
    value = {
        "_target_": f"{_name(data.__class__)}.from_dict",
        "_call_": True,
        "config_dict": data.to_dict(),
    }
    return dumper.represent_data(value)
