"""Megatron 0.20's training config dataclasses (`megatron.training.config`), gigatron's fields.

Each field is one `gigatron train` flag, built by `argument_utils.ArgumentGroupFactory` from
its name, annotation, default and the string under it (docs/training_flags.md). A class holds
the fields of Megatron's class that gigatron has a flag for; where gigatron's default or type
differs from Megatron's, the field's string says so.
"""

from gigatron.training.config.common_config import (
    DistributedInitConfig,
    ProfilingConfig,
    RNGConfig,
)
from gigatron.training.config.container import ConfigContainerBase, PretrainConfigContainer
from gigatron.training.config.resilience_config import RerunStateMachineConfig
from gigatron.training.config.training_config import (
    CheckpointConfig,
    LoggerConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)

__all__ = [
    "CheckpointConfig",
    "ConfigContainerBase",
    "DistributedInitConfig",
    "LoggerConfig",
    "PretrainConfigContainer",
    "ProfilingConfig",
    "RNGConfig",
    "RerunStateMachineConfig",
    "SchedulerConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "ValidationConfig",
]
