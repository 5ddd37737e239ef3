"""Config containers (Megatron 0.20's `config.container`): the configs of a run in one object,
written to and read from dicts and YAML.

`ConfigContainerBase.to_dict` writes each dataclass as a `_target_` mapping (see
`yaml_utils` for functions, partials, enums and dtypes); `from_dict` / `from_yaml` build it
back with `instantiate`, so a YAML file names only allowlisted config classes
(`instantiate_utils`). `from_yaml` reads the file as untrusted (`gigatron.core.untrusted_yaml`:
plain values, bounded size) and names the file in every refusal.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import OptimizerConfig
from gigatron.training.config.common_config import DistributedInitConfig, ProfilingConfig, RNGConfig
from gigatron.training.config.instantiate_utils import (
    InstantiationException,
    InstantiationMode,
    instantiate,
)
from gigatron.training.config.resilience_config import RerunStateMachineConfig
from gigatron.training.config.training_config import (
    CheckpointConfig,
    LoggerConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)
from gigatron.training.config.utils import sanitize_dataclass_config
from gigatron.training.config.yaml_utils import safe_yaml_representers
from gigatron.training.models import Serializable

T = TypeVar("T", bound="ConfigContainerBase")


@dataclass(kw_only=True)
class ConfigContainerBase:
    """A dataclass of configs that converts to and from dicts and YAML files."""

    @classmethod
    def from_dict(
        cls: type[T],
        config_dict: dict[str, Any],
        mode: InstantiationMode = InstantiationMode.STRICT,
    ) -> T:
        """The container `config_dict` (with its `_target_`) describes. Keys that are not fields
        raise ValueError (STRICT) or are dropped (LENIENT); `init=False` fields older versions
        wrote are dropped. `config_dict` is not changed."""
        config_dict = copy.deepcopy(config_dict)
        assert "_target_" in config_dict, f"{cls.__qualname__}.from_dict needs a _target_ key"
        config_dict = sanitize_dataclass_config(config_dict)
        expected = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        extra = set(config_dict) - expected - {"_target_"}
        if extra and mode == InstantiationMode.STRICT:
            raise ValueError(f"Dictionary contains extra keys not in {cls.__qualname__}: {extra}")
        for key in extra:
            config_dict.pop(key)
        return instantiate(config_dict, mode=mode)

    @classmethod
    def from_yaml(
        cls: type[T], yaml_path: str, mode: InstantiationMode = InstantiationMode.LENIENT
    ) -> T:
        """The container a YAML file (as `to_yaml` writes) describes; FileNotFoundError if it
        does not exist. `${...}` interpolations need omegaconf."""
        from gigatron.core.untrusted_yaml import read_yaml

        if not os.path.exists(yaml_path):
            raise FileNotFoundError(f"YAML file not found: {yaml_path}")
        config_dict = read_yaml(yaml_path, what=f"{cls.__qualname__} YAML")
        if not isinstance(config_dict, dict):
            raise ValueError(
                f"{yaml_path}: a {cls.__qualname__} YAML file holds a mapping, got "
                f"{type(config_dict).__name__}"
            )
        try:
            return cls.from_dict(config_dict, mode=mode)
        except InstantiationException as e:
            raise InstantiationException(f"{yaml_path}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        """This container as plain dicts: `_target_` (its class) and each public field, nested
        containers, dataclasses, lists and dicts converted too."""
        out: dict[str, Any] = {"_target_": f"{type(self).__module__}.{type(self).__qualname__}"}
        for f in dataclasses.fields(self):
            if not f.name.startswith("_"):
                out[f.name] = self._convert_value_to_dict(getattr(self, f.name))
        return out

    @classmethod
    def _convert_value_to_dict(cls, value: Any) -> Any:
        """A container by `to_dict`, a Serializable by `as_dict`, an object with `to_cfg_dict`
        by that, a dataclass instance as `_target_` and its public fields, lists / tuples (as
        lists) and dicts item by item; anything else as it is."""
        if isinstance(value, ConfigContainerBase):
            return value.to_dict()
        if isinstance(value, Serializable):
            return value.as_dict()
        if hasattr(value, "to_cfg_dict"):
            return value.to_cfg_dict()
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out = {"_target_": f"{type(value).__module__}.{type(value).__qualname__}"}
            for f in dataclasses.fields(value):
                if not f.name.startswith("_"):
                    out[f.name] = cls._convert_value_to_dict(getattr(value, f.name))
            return out
        if isinstance(value, (list, tuple)):
            return [cls._convert_value_to_dict(v) for v in value]
        if isinstance(value, dict):
            return {k: cls._convert_value_to_dict(v) for k, v in value.items()}
        return value

    def to_yaml(self, yaml_path: str) -> None:
        """Write `to_dict()` as YAML to `yaml_path`."""
        import yaml

        with safe_yaml_representers(), open(yaml_path, "w") as f:
            yaml.safe_dump(self.to_dict(), f, default_flow_style=False)

    def print_yaml(self) -> None:
        import yaml

        with safe_yaml_representers():
            print(yaml.safe_dump(self.to_dict(), default_flow_style=False))

    def __deepcopy__(self, memo):
        result = type(self).__new__(type(self))
        memo[id(self)] = result
        for f in dataclasses.fields(self):
            setattr(result, f.name, copy.deepcopy(getattr(self, f.name), memo))
        return result


@dataclass(kw_only=True)
class PretrainConfigContainer(ConfigContainerBase):
    """The configs `argument_utils.pretrain_cfg_container_from_args` builds from the flags (the
    training entry points still read `--yaml-cfg`'s flat flag lines, not this container's YAML)."""

    train: TrainingConfig
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    model: Any
    """A model config or None (gigatron's pretrain entry points build the model from flags)."""
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig
    ddp: DistributedDataParallelConfig = field(default_factory=DistributedDataParallelConfig)
    dist: DistributedInitConfig = field(default_factory=DistributedInitConfig)
    rng: RNGConfig = field(default_factory=RNGConfig)
    logger: LoggerConfig
    checkpoint: CheckpointConfig
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    rerun_state_machine: RerunStateMachineConfig = field(default_factory=RerunStateMachineConfig)
    straggler: Any = None
    """Megatron's StragglerDetectionConfig; always None (gigatron has no straggler detection)."""
