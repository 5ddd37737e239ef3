"""Model configs that serialize to plain dicts, and the builder interface that turns a config
into (distributed) model chunks. Mirrors `megatron.training.models.base`.

`ModelConfig.as_dict()` writes every dataclass field (nested dataclasses as dicts of their
own) plus `_target_` (the config class's import path) and `_builder_` (the builder's);
callables and the wrap hooks are left out. `from_dict()` imports `_target_` and keeps only
that class's fields. A dict may come from a file, so `_target_` must pass the target allowlist
(`gigatron.training.config.instantiate_utils.target_allowlist`) and name a dataclass, and
`_builder_` a `ModelBuilder` subclass: nothing else is imported or called.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from gigatron.core.enums import ModelType
from gigatron.core.transformer.module import Float16Module, MegatronModule
from gigatron.training._target_allowlist import target_allowlist

Hook = Callable[[list], list]


@runtime_checkable
class Serializable(Protocol):
    """A config that round-trips through a dict carrying its class path in `_target_`."""

    def as_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Serializable: ...


def _import_attr(path: str, key: str, is_ok: Callable[[Any], bool], what: str):
    """`package.module.Name` -> the object, if the allowlist admits the name and the object is
    `what` (a config dict is untrusted data: ValueError in one line otherwise)."""
    if not isinstance(path, str) or not target_allowlist.is_allowed(path):
        raise ValueError(f"{key} {path!r}: not in the target allowlist (instantiate_utils."
                         "target_allowlist); a config names only allowed classes")  # fmt: skip
    module_path, _, name = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{key} {path!r}: cannot be imported ({err})") from None
    if not is_ok(obj):
        raise ValueError(f"{key} {path!r}: is not {what}")
    return obj


def _config_to_dict(config) -> dict[str, Any]:
    cls = type(config)
    out: dict[str, Any] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    for f in fields(config):
        value = getattr(config, f.name)
        if callable(value) or f.name.startswith("_") or f.name in _HOOK_FIELDS:
            continue
        out[f.name] = _config_to_dict(value) if is_dataclass(value) else value
    return out


def _config_from_dict(data: dict[str, Any]):
    target = data.get("_target_")
    if target is None:
        raise ValueError(f"cannot deserialize a config without '_target_': keys {sorted(data)}")
    cls = _import_attr(target, "_target_", lambda o: isinstance(o, type) and is_dataclass(o),
                       "a dataclass")  # fmt: skip
    names = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key in names and not key.startswith("_"):
            nested = isinstance(value, dict) and "_target_" in value
            kwargs[key] = _config_from_dict(value) if nested else value
    return cls(**kwargs)


_HOOK_FIELDS = ("pre_wrap_hooks", "post_wrap_hooks")


@dataclass
class ModelConfig:
    """Base of the per-model configs (pure data; building lives in the `ModelBuilder`).

    Subclasses set `builder`, a ClassVar with the import path of their builder class."""

    builder: ClassVar[str]
    """Import path of the `ModelBuilder` subclass that builds this config."""

    restore_modelopt_state: bool = False
    """Restore ModelOpt quantization / sparsity state (gigatron has no ModelOpt)."""

    extra_checkpoint_metadata: dict[str, Any] | None = None
    """Extra serializable metadata stored with the model in checkpoints."""

    pre_wrap_hooks: list[Hook] = field(default_factory=list)
    """Run in order on the list of model chunks before DDP wrapping; each returns the list."""

    post_wrap_hooks: list[Hook] = field(default_factory=list)
    """Run in order on the wrapped model chunks once built; each returns the list."""

    def get_builder_cls(self) -> type:
        """Import and return the class named by `builder`."""
        return _import_attr(self.builder, "builder", lambda o: isinstance(o, type)
                            and issubclass(o, ModelBuilder), "a ModelBuilder subclass")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict with `_target_` and `_builder_` (hooks and callables left out)."""
        return {**_config_to_dict(self), "_builder_": self.builder}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """The config `as_dict` wrote: `_target_`'s class, its known fields, `_builder_`."""
        config = _config_from_dict(data)
        config.builder = data["_builder_"]
        return config


ModelT = TypeVar("ModelT", bound=MegatronModule)
BuildConfigT = TypeVar("BuildConfigT", bound=ModelConfig)


class ModelBuilder(abc.ABC, Generic[ModelT, BuildConfigT]):
    """Builds one pipeline stage (`build_model`) or every virtual stage of this rank wrapped
    for distributed training (`build_distributed_models`) from a `ModelConfig`. A builder is
    a factory: the state set in `__init__` is read, never changed."""

    def __init__(self, model_config: ModelConfig):
        self._model_config = model_config

    @abc.abstractmethod
    def build_model(
        self, pg_collection, pre_process=None, post_process=None, vp_stage=None
    ) -> ModelT:
        """One model stage (`pre_process`: with embedding, `post_process`: with output)."""

    @abc.abstractmethod
    def build_distributed_models(
        self,
        pg_collection,
        ddp_config=None,
        overlap_param_gather_with_optimizer_step: bool = False,
        use_megatron_fsdp: bool = False,
        use_torch_fsdp2: bool = False,
        wrap_with_ddp: bool = True,
        data_parallel_random_init: bool = False,
        mixed_precision_wrapper: Callable | None = Float16Module,
        model_type: ModelType = ModelType.encoder_or_decoder,
        use_layer_wise_distributed_optimizer: bool = False,
        use_layer_wise_param_layout: bool = True,
    ) -> list[ModelT]:
        """This rank's model chunks (a one-item list without virtual pipelining), with the
        pre-wrap hooks run, wrapped (mixed precision, DDP) and the post-wrap hooks run."""


def compose_hooks(hooks: list[Hook]) -> Hook:
    """One hook running `hooks` in order, each on the previous one's result (none: identity)."""

    def composed(model):
        for hook in hooks:
            model = hook(model)
        return model

    return composed
