"""All configs of one training run in one object (Megatron's PretrainConfigContainer)."""

from dataclasses import dataclass, field
from typing import Any

from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import OptimizerConfig
from gigatron.training.config.common_config import DistributedInitConfig, ProfilingConfig, RNGConfig
from gigatron.training.config.resilience_config import RerunStateMachineConfig
from gigatron.training.config.training_config import (
    CheckpointConfig,
    LoggerConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)


@dataclass(kw_only=True)
class PretrainConfigContainer:
    """The configs `argument_utils.pretrain_cfg_container_from_args` builds from the flags.
    Megatron's container also reads / writes YAML and instantiates `_target_` entries; gigatron's
    is the plain holder (its YAML flags are `--yaml-cfg`)."""

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
